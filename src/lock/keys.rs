//! The names the protocol writes on every node: keys, lease values, claim records, and the token floor.
//!
//! Both stores use these, so the embedded store gives the same answers as the Redis nodes.
//!
//! - A **claimant** is one worker's chain of attempts at one `(job, tick)`: `<worker id>/<uuid>`, made once
//!   ([`super::ClaimRequest::new`]) and reused by every retry of that tick. Each node confirms at most one
//!   claimant per `(job, tick)`, ever; that is the whole of G1 (see `docs/protocol.md`).
//! - A **lease value** is one attempt of a claimant: `<claimant>|<attempt>|<tick ms>|<fingerprint>`. The
//!   attempt number is unique in the process, so an undo of an old attempt never deletes a newer one; the tick
//!   tells a contender for the same tick (wait it out) from the previous run still holding the job (skip);
//!   the fingerprint tells which workers disagree on the job's definition.
//! - A **claim record** is `<tick ms> <lease value>`: the highest tick this node confirmed, and who did.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{FencingToken, Overlap};
use crate::schedule::Tick;

/// The three keys of one claim on every node: lease, fence counter, claim record.
///
/// The lease key depends on `overlap` (one per job with `skip`, one per tick with `allow`); the fence and the
/// claim do not, so workers that disagree on `overlap` (a rollout) still meet on the claim record.
pub fn claim_keys(prefix: &str, job: &str, tick: Tick, overlap: Overlap) -> [String; 3] {
    let lease = match overlap {
        Overlap::Skip => format!("{prefix}:{{{job}}}:lease"),
        Overlap::Allow => format!("{prefix}:{{{job}}}:lease:{}", tick.as_millis()),
    };
    [
        lease,
        format!("{prefix}:{{{job}}}:fence"),
        format!("{prefix}:{{{job}}}:claim"),
    ]
}

/// The lease key of a granted lease (the first of its [`claim_keys`]).
pub(crate) fn lease_key(prefix: &str, lease: &super::Lease) -> String {
    let [key, _, _] = claim_keys(prefix, &lease.job, lease.tick, lease.overlap);
    key
}

/// The lowest token a lease of `tick` may carry: the tick in milliseconds × 1000.
///
/// Tokens of later ticks therefore start above every token a job can have reached at an earlier tick (it
/// would take 1000 grants within one millisecond of schedule to catch up), which keeps tokens of later ticks
/// above those of earlier ones even if nodes forget their fence counters. Below 2^53 (exact in Lua) until
/// the year 2255.
pub fn token_floor(tick: Tick) -> FencingToken {
    u64::try_from(tick.as_millis())
        .unwrap_or(0)
        .saturating_mul(1000)
}

/// A new claimant for one worker's race for one `(job, tick)`.
pub(crate) fn new_claimant(worker_id: &str) -> String {
    format!("{worker_id}/{}", uuid::Uuid::new_v4().simple())
}

/// The lease value of a new attempt of `claimant`.
pub(crate) fn attempt_value(claimant: &str, tick: Tick, fingerprint: &str) -> String {
    static ATTEMPTS: AtomicU64 = AtomicU64::new(1);
    let attempt = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
    format!("{claimant}|{attempt}|{}|{fingerprint}", tick.as_millis())
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
}

impl Holder {
    /// Reads a lease value; never fails (what cannot be read stays `None`).
    pub fn from_value(value: &str) -> Holder {
        let mut fields = value.split('|');
        let claimant = fields.next().unwrap_or_default().to_string();
        let _attempt = fields.next();
        let tick = fields.next().and_then(|tick| tick.parse().ok()).map(Tick);
        let fingerprint = fields.next().map(str::to_string);
        let worker = claimant
            .rsplit_once('/')
            .map_or(claimant.as_str(), |(worker, _)| worker)
            .to_string();
        Holder {
            worker,
            claimant,
            tick,
            fingerprint,
        }
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
        let value = attempt_value(&claimant, Tick(1_000), "00ff00ff00ff00ff");
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
            attempt_value(&claimant, Tick(1), "f"),
            attempt_value(&claimant, Tick(1), "f")
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
}
