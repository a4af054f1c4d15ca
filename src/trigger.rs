//! Trigger requests: `redcron trigger JOB` asks for one extra run of a job now.
//!
//! The command writes a [`TriggerRequest`] to every node of the store (a majority must take it); every live
//! worker reads the requests once a second (one read per node) and claims each request of a job it runs
//! through the lock, as a claim of the request's own series ([`crate::lock::Series::Trigger`]) whose tick is
//! the request's time. Exactly one worker wins each request (G1); it runs the job with `REDCRON_TRIGGER`
//! set, records the run in the history under the request's id (the command reads its outcome there), and
//! deletes the request. A request that nobody handles ends with its window (`not_after`); the store drops it
//! [`KEEP_AFTER_WINDOW`] later, so requests never pile up.
//!
//! Polling rather than a wake-up (Redis pub/sub): a poll cannot miss a message while a connection is being
//! re-opened, needs no connection of its own per node, and costs one small read per node and second, while
//! a trigger waits at most a second for it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::schedule::Tick;

/// How long the store keeps a request after its window ended (for a worker that read it late to find it
/// claimed, not gone). Its claim records last longer still ([`crate::lock::ONE_OFF_RECORD_KEEP`]).
pub const KEEP_AFTER_WINDOW: Duration = Duration::from_secs(60);

/// How long a trigger may wait to be claimed, unless `--timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest window a request may have (`--timeout`): a stored request with a longer one is refused.
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The largest stored request that is read, in bytes: a request is a few hundred; anything near this is
/// not one, and is skipped before it is parsed.
pub const MAX_STORED_BYTES: usize = 16 * 1024;

/// The longest request id, and the longest `by`, in bytes.
const MAX_ID: usize = 64;
const MAX_BY: usize = 256;

/// The latest instant a request may name: 9999-12-31T23:59:59.999Z, in milliseconds (as for a node's
/// `TIME`, [`crate::clock::cluster::node_time_us`]): every time derived from it stays far inside what the
/// clocks, the scripts and the stores compute with.
const LATEST_MS: i64 = 253_402_300_799_999;

/// Why a stored request was not taken: it is data from the store, which anyone who can write to the store
/// may have planted, so it is checked before any worker acts on it or computes with its times.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("{bytes} bytes, more than the {MAX_STORED_BYTES} a request takes")]
    TooLarge { bytes: usize },
    #[error("not a trigger request: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
}

/// How far a request's time may be ahead of a worker's cluster time: further, the worker refuses it
/// ([`TriggerRequest::fits`]), and `redcron trigger` refuses to ask from a clock that far off.
///
/// The command asks at cluster time (on Redis, its clock corrected by the nodes' as a worker's is), so an
/// honest request is ahead of a worker's time by no more than their measuring errors (milliseconds; on
/// etcd and the embedded store, the hosts' offset, which NTP keeps far below this). A request further
/// ahead would be claimed with the token floor of its time (`tick × 1000`), raising the tokens of every
/// later run of the job by as much.
pub const MAX_AHEAD: Duration = Duration::from_secs(10);

/// Why a worker refuses a request read from the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// Its time is more than [`MAX_AHEAD`] ahead of the worker's cluster time.
    #[error("requested at {}, {} ahead of this worker's cluster time (at most {} allowed): the asking \
             host's clock is wrong, or something other than redcron trigger wrote it",
            .requested_at.to_rfc3339(), crate::config::show_duration(*.ahead),
            crate::config::show_duration(MAX_AHEAD))]
    Ahead {
        requested_at: DateTime<Utc>,
        ahead: Duration,
    },
    /// Its window (`not_after − requested_at`) is negative or longer than [`MAX_WINDOW`].
    #[error("its window, from {} to {}, is not between 0 and {}", .requested_at.to_rfc3339(),
            .not_after.to_rfc3339(), crate::config::show_duration(MAX_WINDOW))]
    Window {
        requested_at: DateTime<Utc>,
        not_after: DateTime<Utc>,
    },
}

impl Unfit {
    /// The refusal as a stable word for the `trigger.refused` event: `ahead`, `window`.
    pub fn reason(&self) -> &'static str {
        match self {
            Unfit::Ahead { .. } => "ahead",
            Unfit::Window { .. } => "window",
        }
    }
}

/// One `redcron trigger` request. Field names are stable (`docs/history.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerRequest {
    /// Unique per request: 32 hex digits.
    pub id: String,
    pub job: String,
    /// When the command asked (its host's clock): the run's tick (`REDCRON_TICK`).
    pub requested_at: DateTime<Utc>,
    /// Until when workers may claim it (cluster time); after it, the nodes refuse.
    pub not_after: DateTime<Utc>,
    /// Who asked: `user@host`.
    #[serde(default)]
    pub by: String,
}

impl TriggerRequest {
    /// A new request for `job` at `now`, to be claimed within `timeout`.
    pub fn new(job: &str, now: DateTime<Utc>, timeout: Duration, by: &str) -> TriggerRequest {
        TriggerRequest {
            id: uuid::Uuid::new_v4().simple().to_string(),
            job: job.to_string(),
            requested_at: now,
            not_after: now + chrono::Duration::from_std(timeout).unwrap_or_default(),
            by: by.to_string(),
        }
    }

    /// Whether a worker whose cluster time is `now` may claim the request: its time is at most
    /// [`MAX_AHEAD`] ahead of `now`, and its window between 0 and [`MAX_WINDOW`]. A request read from the
    /// store is data from outside: it may have been written from a clock far off, or by hand.
    pub fn fits(&self, now: DateTime<Utc>) -> Result<(), Unfit> {
        // Differences of two instants in chrono's range never overflow a `TimeDelta`.
        let ahead = (self.requested_at - now).to_std().unwrap_or_default();
        if ahead > MAX_AHEAD {
            return Err(Unfit::Ahead {
                requested_at: self.requested_at,
                ahead,
            });
        }
        let window = (self.not_after - self.requested_at).to_std();
        if window.map_or(true, |window| window > MAX_WINDOW) {
            return Err(Unfit::Window {
                requested_at: self.requested_at,
                not_after: self.not_after,
            });
        }
        Ok(())
    }

    /// The tick of the run it asks for: the request's time in milliseconds.
    pub fn tick(&self) -> Tick {
        Tick(self.requested_at.timestamp_millis())
    }

    /// When the store drops the request, in milliseconds since the epoch.
    pub fn expires_at_ms(&self) -> i64 {
        let keep = i64::try_from(KEEP_AFTER_WINDOW.as_millis()).unwrap_or(i64::MAX);
        self.not_after.timestamp_millis().saturating_add(keep)
    }

    /// The request as stored: one line of JSON.
    pub fn to_json(&self) -> String {
        // Serializing strings and timestamps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored request and checks it ([`TriggerRequest::check`]); the error says what was wrong,
    /// for a warning that names the node and the key.
    pub fn from_json(text: &str) -> Result<TriggerRequest, BadRequest> {
        if text.len() > MAX_STORED_BYTES {
            return Err(BadRequest::TooLarge { bytes: text.len() });
        }
        let request: TriggerRequest = serde_json::from_str(text)?;
        request.check()?;
        Ok(request)
    }

    /// [`TriggerRequest::from_json`] of the request stored under `key` (its id in the store): a request
    /// whose id is not its key is refused too, since it is deleted, and on etcd claimed, by its id.
    pub fn read(key: &str, text: &str) -> Result<TriggerRequest, BadRequest> {
        let request = TriggerRequest::from_json(text)?;
        if request.id != key {
            return Err(BadRequest::Invalid(format!(
                "its id {:?} is not its key",
                request.id
            )));
        }
        Ok(request)
    }

    /// Whether the request is one that `redcron trigger` can have written: an id of up to 64 letters,
    /// digits, `-` or `_`; a job name as the config takes them; a `by` of at most 256 bytes; both times
    /// between 1970 and 9999, and a window (`not_after` after `requested_at`) of at most [`MAX_WINDOW`].
    /// Every time a worker derives from a request that passed stays representable, so no arithmetic on
    /// it can overflow.
    pub fn check(&self) -> Result<(), BadRequest> {
        let invalid = |why: String| Err(BadRequest::Invalid(why));
        let word = |text: &str, extra: &str| {
            !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
        };
        if self.id.len() > MAX_ID || !word(&self.id, "-_") {
            return invalid(format!(
                "bad id {}: expected 1 to {MAX_ID} letters, digits, `-` or `_`",
                crate::logging::shorten(&format!("{:?}", self.id), 80)
            ));
        }
        if !word(&self.job, "_.-") {
            return invalid(format!(
                "bad job name {}",
                crate::logging::shorten(&format!("{:?}", self.job), 80)
            ));
        }
        if self.by.len() > MAX_BY {
            return invalid(format!(
                "`by` is {} bytes long, more than {MAX_BY}",
                self.by.len()
            ));
        }
        for (field, at) in [
            ("requested_at", self.requested_at),
            ("not_after", self.not_after),
        ] {
            if !(0..=LATEST_MS).contains(&at.timestamp_millis()) {
                return invalid(format!(
                    "{field} {} is not between 1970 and 9999",
                    at.to_rfc3339()
                ));
            }
        }
        let window = self.not_after - self.requested_at;
        let longest = chrono::Duration::from_std(MAX_WINDOW).unwrap_or_default();
        if window <= chrono::Duration::zero() || window > longest {
            return invalid(format!(
                "its window, {} to {}, is not between 0 and {}",
                self.requested_at.to_rfc3339(),
                self.not_after.to_rfc3339(),
                crate::config::show_duration(MAX_WINDOW)
            ));
        }
        Ok(())
    }
}

/// The requests read from several nodes, each once (by id), oldest first: a request that reached any node
/// that answered is handled, so one that reached only a minority (a `trigger` that exited 3) may still run
/// — once, since its claim is one.
pub fn merge(replicas: impl IntoIterator<Item = Vec<TriggerRequest>>) -> Vec<TriggerRequest> {
    let mut all: Vec<TriggerRequest> = replicas.into_iter().flatten().collect();
    all.sort_by(|a, b| (a.requested_at, &a.id).cmp(&(b.requested_at, &b.id)));
    all.dedup_by(|a, b| a.id == b.id);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_merge_once_each_oldest_first() {
        let now = DateTime::from_timestamp_millis(1_795_436_805_123).unwrap_or_default();
        let a = TriggerRequest::new("j", now, DEFAULT_TIMEOUT, "ops@vm");
        let b = TriggerRequest::new("j", now - chrono::Duration::seconds(1), DEFAULT_TIMEOUT, "");
        assert_eq!(
            TriggerRequest::from_json(&a.to_json()).ok(),
            Some(a.clone())
        );
        assert_eq!(a.tick(), Tick(1_795_436_805_123));
        assert_eq!(a.expires_at_ms(), 1_795_436_805_123 + 90_000);
        let merged = merge([vec![a.clone(), b.clone()], vec![a.clone()]]);
        assert_eq!(merged, [b, a]);
    }

    #[test]
    fn requests_that_trigger_cannot_have_written_are_refused() {
        let now = DateTime::from_timestamp_millis(1_795_436_805_123).unwrap_or_default();
        let good = TriggerRequest::new("j", now, DEFAULT_TIMEOUT, "ops@vm");
        assert!(TriggerRequest::read(&good.id, &good.to_json()).is_ok());
        let max = TriggerRequest::new("j", now, MAX_WINDOW, "ops@vm");
        assert!(TriggerRequest::from_json(&max.to_json()).is_ok());
        let refused = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json = serde_json::to_value(&good).unwrap_or_default();
            edit(&mut json);
            let why = TriggerRequest::read(&good.id, &json.to_string())
                .expect_err("refused")
                .to_string();
            assert!(why.len() < 300, "{why}");
            why
        };
        let why = refused(&|j| j["not_after"] = "+262142-12-31T23:59:30Z".into());
        assert!(why.contains("not_after"), "{why}");
        refused(&|j| j["requested_at"] = "+262142-12-31T23:59:00Z".into());
        refused(&|j| j["requested_at"] = "1960-01-01T00:00:00Z".into());
        let why = refused(&|j| j["not_after"] = j["requested_at"].clone());
        assert!(why.contains("window"), "{why}");
        refused(&|j| j["not_after"] = "2026-11-25T10:00:00Z".into());
        refused(&|j| j["id"] = "../x".into());
        refused(&|j| j["id"] = "a".repeat(100_000).into());
        refused(&|j| j["job"] = "".into());
        refused(&|j| j["job"] = "a b".into());
        refused(&|j| j["by"] = "x".repeat(1 << 20).into());
        refused(&|j| j["id"] = 5.into());
        refused(&|j| *j = serde_json::json!([1, 2]));
        let other = TriggerRequest::new("j", now, DEFAULT_TIMEOUT, "ops@vm");
        assert!(TriggerRequest::read(&other.id, &good.to_json()).is_err());
        let huge = "x".repeat(MAX_STORED_BYTES + 1);
        assert!(matches!(
            TriggerRequest::from_json(&huge),
            Err(BadRequest::TooLarge { .. })
        ));
    }

    #[test]
    fn a_request_far_ahead_or_with_an_absurd_window_is_unfit() {
        let now = DateTime::from_timestamp_millis(1_795_436_805_123).unwrap_or_default();
        let at = |seconds| now + chrono::Duration::seconds(seconds);
        let fine = TriggerRequest::new("j", at(10), Duration::from_secs(24 * 3600), "");
        assert_eq!(fine.fits(now), Ok(()));
        assert_eq!(
            TriggerRequest::new("j", at(-3600), DEFAULT_TIMEOUT, "").fits(now),
            Ok(())
        );
        let ahead = TriggerRequest::new("j", at(11), DEFAULT_TIMEOUT, "").fits(now);
        assert_eq!(ahead.map_err(|u| u.reason()), Err("ahead"));
        let year_2300 = "2300-01-01T00:00:00Z".parse().unwrap_or(now);
        let far = TriggerRequest::new("j", year_2300, DEFAULT_TIMEOUT, "");
        let refused = far.fits(now).expect_err("far ahead");
        assert!(
            refused.to_string().contains("2300-01-01T00:00:00+00:00"),
            "{refused}"
        );
        let mut long = TriggerRequest::new("j", now, DEFAULT_TIMEOUT, "");
        long.not_after = DateTime::<Utc>::MAX_UTC;
        assert_eq!(long.fits(now).map_err(|u| u.reason()), Err("window"));
        long.not_after = now - chrono::Duration::seconds(1);
        assert_eq!(long.fits(now).map_err(|u| u.reason()), Err("window"));
        let mut earliest = TriggerRequest::new("j", now, DEFAULT_TIMEOUT, "");
        earliest.requested_at = DateTime::<Utc>::MIN_UTC;
        assert_eq!(earliest.fits(now).map_err(|u| u.reason()), Err("window"));
    }
}
