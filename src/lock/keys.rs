//! The names the protocol writes on every node: keys, lease values, claim records, and the token floor.
//!
//! Every store writes these — on the Redis nodes, in the etcd cluster, in the embedded store's file — so
//! the stores give the same answers and the CLI reads them the same way.
//!
//! - A **claimant** is one worker's chain of attempts at one `(job, tick)`: `<worker id>/<uuid>`, made once
//!   ([`super::ClaimRequest::new`]) and reused by every retry of that tick. Each node confirms at most one
//!   claimant per `(job, tick)`, ever; that is the whole of G1 (see `docs/protocol.md`).
//! - A **lease value** is one attempt of a claimant: `<claimant>|<attempt>|<tick ms>|<fingerprint>`, and
//!   `|<series tag>` for a claim outside the schedule ([`Series::tag`]). The attempt number is unique in the
//!   process, so an undo of an old attempt never deletes a newer one; the tick and series tell a contender
//!   for the same tick (wait it out) from another run still holding the job (skip); the fingerprint tells
//!   which workers disagree on the job's definition.
//! - A **claim record** is `<tick ms> <lease value>`: the highest tick this node confirmed in the record's
//!   series, and who did.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{FencingToken, Overlap, Refusal, Series};
use crate::schedule::Tick;

/// The four keys of one claim on every node: lease, fence counter, claim record, pause.
///
/// The lease key depends on `overlap` (one per job with `skip`, shared by every series; one per tick and
/// series instance with `allow`); the fence does not, and the claim record depends on the series only
/// ([`Series::key_suffix`]), so workers that disagree on `overlap` (a rollout) still meet on the claim
/// record. The pause key (`…:paused`) is the job's, whatever the series.
pub fn claim_keys(
    prefix: &str,
    job: &str,
    tick: Tick,
    overlap: Overlap,
    series: &Series,
) -> [String; 4] {
    let suffix = series.key_suffix(tick);
    let lease = match (overlap, series) {
        (Overlap::Skip, _) => format!("{prefix}:{{{job}}}:lease"),
        (Overlap::Allow, Series::Schedule) => {
            format!("{prefix}:{{{job}}}:lease:{}", tick.as_millis())
        }
        (Overlap::Allow, _) => format!("{prefix}:{{{job}}}:lease{suffix}"),
    };
    [
        lease,
        format!("{prefix}:{{{job}}}:fence"),
        format!("{prefix}:{{{job}}}:claim{suffix}"),
        pause_key(prefix, job),
    ]
}

/// The key that pauses `job` on a node ([`super::Pause`]).
pub fn pause_key(prefix: &str, job: &str) -> String {
    format!("{prefix}:{{{job}}}:paused")
}

/// The key that orders `job`'s pauses and resumes on etcd: each one writes it, in a transaction that
/// applies only if it is unchanged since read. It is never deleted, so its `mod_revision` only grows (an
/// absent key reads 0, so would a deleted one): a copy of an older write compares a revision that is gone.
pub fn pause_seq_key(prefix: &str, job: &str) -> String {
    format!("{prefix}:{{{job}}}:pause_seq")
}

/// The lease key of a granted lease (the first of its [`claim_keys`]).
pub(crate) fn lease_key(prefix: &str, lease: &super::Lease) -> String {
    let [key, ..] = claim_keys(prefix, &lease.job, lease.tick, lease.overlap, &lease.series);
    key
}

/// The lowest token a lease of `tick` may carry: the tick in milliseconds × 1000 (0 before 1970;
/// saturating — [`next_token`] refuses what passes [`MAX_TOKEN`]).
///
/// Tokens of later ticks therefore start above every token a job can have reached at an earlier tick (it
/// would take 1000 grants within one millisecond of schedule to catch up), which keeps tokens of later ticks
/// above those of earlier ones even if nodes forget their fence counters. Below 2^53 until the year 2255,
/// below [`MAX_TOKEN`] until the year 294,247.
pub fn token_floor(tick: Tick) -> FencingToken {
    u64::try_from(tick.as_millis())
        .unwrap_or(0)
        .saturating_mul(1000)
}

/// The highest token a store hands out: 2^63 − 1, the largest integer that every store keeps exactly (a
/// SQLite `INTEGER`, an etcd revision, a Redis integer). The Redis scripts compare fence counters as
/// decimal text, never as Lua numbers (doubles, exact only below 2^53), so every token up to it is exact.
pub const MAX_TOKEN: FencingToken = i64::MAX as FencingToken;

/// The token of a claim of `tick` where the highest fence counter read is `fence`:
/// `max(fence + 1, token_floor(tick))`, computed exactly. Refused ([`Refusal::TokenLimit`]) when it would
/// pass [`MAX_TOKEN`], instead of a token that wraps, saturates or repeats the last one.
pub fn next_token(fence: FencingToken, tick: Tick) -> Result<FencingToken, Refusal> {
    let floor = u64::try_from(tick.as_millis())
        .unwrap_or(0)
        .checked_mul(1000);
    match fence.checked_add(1).zip(floor) {
        Some((next, floor)) if next.max(floor) <= MAX_TOKEN => Ok(next.max(floor)),
        _ => Err(Refusal::TokenLimit { fence, tick }),
    }
}

/// A new claimant for one worker's race for one `(job, tick)`.
pub(crate) fn new_claimant(worker_id: &str) -> String {
    format!("{worker_id}/{}", uuid::Uuid::new_v4().simple())
}

/// The lease value of a new attempt of `claimant` in `series`.
pub(crate) fn attempt_value(
    claimant: &str,
    tick: Tick,
    fingerprint: &str,
    series: &Series,
) -> String {
    static ATTEMPTS: AtomicU64 = AtomicU64::new(1);
    let attempt = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
    let value = format!("{claimant}|{attempt}|{}|{fingerprint}", tick.as_millis());
    match series.tag() {
        Some(tag) => format!("{value}|{tag}"),
        None => value,
    }
}

/// The claimant part of a lease value (the whole value for a value written before claimants existed).
pub(crate) fn claimant_of(value: &str) -> &str {
    value
        .split_once('|')
        .map_or(value, |(claimant, _)| claimant)
}

/// Who holds a lease or confirmed a claim on a node, as read from its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The worker's id.
    pub worker: String,
    /// The claimant (`<worker id>/<uuid>`).
    pub claimant: String,
    /// The tick it holds or claimed, if the value says.
    pub tick: Option<Tick>,
    /// Its fingerprint of the job's definition, if the value says.
    pub fingerprint: Option<String>,
    /// The series of its claim (the schedule unless the value says otherwise).
    pub series: Series,
}

impl Holder {
    /// Reads a lease value; never fails (what cannot be read stays `None`).
    pub fn from_value(value: &str) -> Holder {
        let mut fields = value.split('|');
        let claimant = fields.next().unwrap_or_default().to_string();
        let _attempt = fields.next();
        let tick = fields.next().and_then(|tick| tick.parse().ok()).map(Tick);
        let fingerprint = fields.next().map(str::to_string);
        let series = Series::from_tag(fields.next());
        let worker = claimant
            .rsplit_once('/')
            .map_or(claimant.as_str(), |(worker, _)| worker)
            .to_string();
        Holder {
            worker,
            claimant,
            tick,
            fingerprint,
            series,
        }
    }

    /// Whether this holder is a claimant of the same claim instance as `tick` in `series`: a contender,
    /// rather than another run holding the job.
    pub fn contends_for(&self, tick: Tick, series: &Series) -> bool {
        self.tick == Some(tick) && &self.series == series
    }

    /// Reads a claim record (`<tick ms> <lease value>`); a bare number (written before claimants existed)
    /// names no holder.
    pub fn from_record(record: &str) -> Option<Holder> {
        let (tick, value) = record.split_once(' ')?;
        let mut holder = Holder::from_value(value);
        holder.tick = tick.parse().ok().map(Tick).or(holder.tick);
        Some(holder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_holder() {
        let claimant = new_claimant("web-1");
        let value = attempt_value(
            &claimant,
            Tick(1_000),
            "00ff00ff00ff00ff",
            &Series::Schedule,
        );
        assert_eq!(claimant_of(&value), claimant);
        let holder = Holder::from_value(&value);
        assert_eq!(holder.worker, "web-1");
        assert_eq!(holder.claimant, claimant);
        assert_eq!(holder.tick, Some(Tick(1_000)));
        assert_eq!(holder.fingerprint.as_deref(), Some("00ff00ff00ff00ff"));
        let record = Holder::from_record(&format!("1000 {value}")).expect("a record");
        assert_eq!(record, holder);
    }

    #[test]
    fn attempts_of_one_claimant_differ() {
        let claimant = new_claimant("w");
        assert_ne!(
            attempt_value(&claimant, Tick(1), "f", &Series::Schedule),
            attempt_value(&claimant, Tick(1), "f", &Series::Schedule)
        );
    }

    #[test]
    fn legacy_values_and_garbage_read_without_panicking() {
        let legacy = Holder::from_value("web-1/0b7c");
        assert_eq!(legacy.worker, "web-1");
        assert_eq!(legacy.tick, None);
        assert_eq!(Holder::from_record("1700000000000"), None);
        let garbage = Holder::from_value("||x|");
        assert_eq!(garbage.tick, None);
        assert_eq!(claimant_of("a|b"), "a");
    }

    #[test]
    fn tokens_are_exact_to_the_bound_and_refused_past_it() {
        let now = Tick(1_795_436_805_123);
        assert_eq!(next_token(0, now), Ok(1_795_436_805_123_000));
        // Past 2^53, where a double would round: still exactly one more.
        assert_eq!(
            next_token(10_413_792_000_569_000, now),
            Ok(10_413_792_000_569_001)
        );
        assert_eq!(next_token(MAX_TOKEN - 1, now), Ok(MAX_TOKEN));
        let at_the_bound = next_token(MAX_TOKEN, now);
        assert_eq!(
            at_the_bound,
            Err(Refusal::TokenLimit {
                fence: MAX_TOKEN,
                tick: now
            })
        );
        assert_eq!(at_the_bound.map_err(|r| r.reason()), Err("token_limit"));
        assert!(next_token(u64::MAX, now).is_err());
        // A tick whose floor passes the bound (the year 294,247 and later), and one before 1970.
        assert!(next_token(0, Tick(i64::MAX)).is_err());
        assert!(next_token(0, Tick(9_223_372_036_854_776)).is_err());
        assert_eq!(
            next_token(0, Tick(9_223_372_036_854_775)),
            Ok(9_223_372_036_854_775_000)
        );
        assert_eq!(next_token(41, Tick(-5)), Ok(42));
    }

    #[test]
    fn series_travel_in_values_and_keys() {
        let trigger = Series::Trigger("9f".to_string());
        let value = attempt_value("w/1", Tick(7), "f", &trigger);
        let holder = Holder::from_value(&value);
        assert!(holder.contends_for(Tick(7), &trigger));
        assert!(!holder.contends_for(Tick(7), &Series::Schedule));
        assert_eq!(Holder::from_value("w/1|2|7|f").series, Series::Schedule);
        let skip = claim_keys("p", "j", Tick(7), Overlap::Skip, &trigger);
        assert_eq!(
            skip,
            [
                "p:{j}:lease",
                "p:{j}:fence",
                "p:{j}:claim:trigger:9f",
                "p:{j}:paused"
            ]
        );
        let allow = claim_keys("p", "j", Tick(7), Overlap::Allow, &Series::Retry(2));
        assert_eq!(allow[0], "p:{j}:lease:retry:7:2");
        assert_eq!(allow[2], "p:{j}:claim:retry:7:2");
        let schedule = claim_keys("p", "j", Tick(7), Overlap::Allow, &Series::Schedule);
        assert_eq!(
            schedule[..3],
            ["p:{j}:lease:7", "p:{j}:fence", "p:{j}:claim"]
        );
    }
}
