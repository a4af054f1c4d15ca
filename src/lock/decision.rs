//! The one claim decision: what a store's snapshot of one claim instance gives a claim request.
//!
//! Every store reads the same few things in one snapshot — a transaction, a script run, a set of locked
//! rows — and hands them to [`decide`]: the job's pause, the series' claim record, a trigger's request (its
//! *anchor*), the store's clock, and the lease. The embedded, SQL, etcd and ZooKeeper stores call it from
//! Rust; on a Redis node the same rule runs as Lua (`ACQUIRE` and `CONFIRM` in
//! [`crate::store::redis::scripts`]), and a test runs one table of cases through both on a real node so
//! that the two cannot disagree (`store::redis::decision_tests`). The token a grant carries is
//! [`super::keys::next_token`], the other half of the rule, also computed in one place.
//!
//! The checks, in order (the first that applies answers):
//! 1. **Paused** while a pause stands on the job.
//! 2. **Already claimed** (`by: None`) once a one-off claim's window (a trigger's or retry's `not_after`)
//!    has ended on the store's clock: its claim record expires after that, and must never be needed again.
//! 3. **Already claimed** if another claimant confirmed this tick, or anyone a later tick, in the series —
//!    a record that cannot be read counts as claimed: nothing proves the tick free. *This is the heart of
//!    exactly-once: a claim instance's record names one claimant per tick, ever, and its tick only grows.*
//! 4. **Already claimed** (`by: None`) for a trigger whose request is gone (handled or expired), on the
//!    stores that keep one beside the claim.
//! 5. **Refused** (`TickAhead`) for a tick more than [`super::MAX_TICK_AHEAD`] ahead of the store's own
//!    clock, which would push the job's token floor up by as much; not checked on etcd and ZooKeeper,
//!    which have no clock to read in a transaction (the tick came from this host's clock: comparing the
//!    two would prove nothing).
//! 6. **Busy** if another tick's run holds the lease (`overlap: skip`); **contended** if another claimant
//!    of this tick holds it (it is between its rounds, or crashed there: retry after the lease's time
//!    left, at least `retry_delay`), or this claimant's own lease that the store will not let it replace.
//! 7. Else **take**: the claimant's own lease or record of an earlier attempt is replaced (a retry is
//!    idempotent).

use std::time::Duration;

use super::keys::{claimant_of, Holder};
use super::{ClaimOutcome, ClaimRequest, Pause, Refusal, MAX_TICK_AHEAD};
use crate::schedule::Tick;

/// What a store read for one claim, in one snapshot.
#[derive(Debug, Clone)]
pub(crate) struct ClaimView<'a> {
    /// The pause standing on the job (one whose end has passed is none).
    pub pause: Option<Pause>,
    /// The series' claim record.
    pub record: Option<Record<'a>>,
    /// A trigger's request, where the store keeps one for its claims to check.
    pub anchor: Anchor,
    /// The store's clock, in ms since the epoch: windows end by it. The database's or the node's where it
    /// has one, else this host's.
    pub now_ms: i64,
    /// Whether a tick far ahead of [`ClaimView::now_ms`] is refused: where that is the store's own clock (a
    /// Redis node's, the database's) or the one host's every worker of the store shares (embedded).
    pub check_ahead: bool,
    /// The lease of the claim instance, if one stands (expired and released leases are none).
    pub lease: Option<LeaseSeen<'a>>,
}

/// A claim record as read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Record<'a> {
    /// `tick` confirmed by the attempt whose lease value is `value`.
    Claimed { tick: Tick, value: &'a str },
    /// A record that does not parse (or is not one): it proves no tick free.
    Unreadable,
}

impl<'a> Record<'a> {
    /// A stored record, `<tick ms> <lease value>`, as the Lua scripts read it: a bare number (written
    /// before records named their claimant) is that tick claimed by no one in particular; anything else
    /// is unreadable.
    pub(crate) fn parse(text: &'a str) -> Record<'a> {
        let (tick, value) = match text.split_once(' ') {
            Some((_, "")) => return Record::Unreadable,
            Some((tick, value)) => (tick, value),
            None => (text, ""),
        };
        match integer(tick) {
            Some(tick) => Record::Claimed {
                tick: Tick(tick),
                value,
            },
            None => Record::Unreadable,
        }
    }
}

/// `-?[0-9]+` as a number, clamped to `i64`'s range: the scripts compare such text exactly at any size,
/// and no tick lies beyond the clamp, so each compares with a tick as the script's does.
fn integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        text.parse::<i64>()
            .unwrap_or(if digits.len() == text.len() {
                i64::MAX
            } else {
                i64::MIN
            }),
    )
}

/// A trigger's request, as a claim on it reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Anchor {
    /// The store keeps no request beside the claim (or the claim is no trigger's): nothing to check.
    Unchecked,
    /// The request stands.
    Present,
    /// The request is gone: handled, or expired.
    Gone,
}

/// A lease that stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LeaseSeen<'a> {
    /// Its value: the holding attempt ([`super::keys::attempt_value`]).
    pub value: &'a str,
    /// How long it stands yet, where the store tells.
    pub left: Option<Duration>,
    /// Whether the claimant that holds it may replace it: false for its lease of an ended ZooKeeper
    /// session, which only the ensemble deletes (with that session).
    pub replaceable: bool,
}

/// The decision: take the tick, or the outcome that answers the claim.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Write the claim (record, lease and fence) with [`super::keys::next_token`]'s token.
    Take,
    /// A final or waiting outcome: nothing is written.
    Answer(ClaimOutcome),
}

/// What `seen` gives `request` (see the module for the rule). `retry_delay` is the least wait a
/// contended claim is told.
pub(crate) fn decide(
    request: &ClaimRequest,
    seen: &ClaimView<'_>,
    retry_delay: Duration,
) -> Decision {
    if let Some(pause) = &seen.pause {
        return Decision::Answer(ClaimOutcome::Paused(pause.clone()));
    }
    if request
        .not_after
        .is_some_and(|t| seen.now_ms > t.as_millis())
    {
        return Decision::Answer(ClaimOutcome::AlreadyClaimed { by: None });
    }
    match seen.record {
        Some(Record::Claimed { tick, value })
            if tick > request.tick
                || (tick == request.tick && claimant_of(value) != request.claimant) =>
        {
            // A bare number names no one.
            let by = (!value.is_empty()).then(|| Holder {
                tick: Some(tick),
                ..Holder::from_value(value)
            });
            return Decision::Answer(ClaimOutcome::AlreadyClaimed { by });
        }
        Some(Record::Unreadable) => {
            return Decision::Answer(ClaimOutcome::AlreadyClaimed { by: None });
        }
        Some(Record::Claimed { .. }) | None => {}
    }
    if request.series.trigger().is_some() && seen.anchor == Anchor::Gone {
        return Decision::Answer(ClaimOutcome::AlreadyClaimed { by: None });
    }
    let ahead_ms = i64::try_from(MAX_TICK_AHEAD.as_millis()).unwrap_or(i64::MAX);
    if seen.check_ahead && request.tick.as_millis() > seen.now_ms.saturating_add(ahead_ms) {
        return Decision::Answer(ClaimOutcome::Refused(Refusal::TickAhead {
            tick: request.tick,
            store_ms: seen.now_ms,
        }));
    }
    let Some(lease) = seen.lease else {
        return Decision::Take;
    };
    let ours = claimant_of(lease.value) == request.claimant;
    if ours && lease.replaceable {
        return Decision::Take;
    }
    let holder = Holder::from_value(lease.value);
    Decision::Answer(
        if ours || holder.contends_for(request.tick, &request.series) {
            ClaimOutcome::Contended {
                holder: Some(holder),
                retry_in: lease.left.map_or(retry_delay, |left| left.max(retry_delay)),
            }
        } else {
            ClaimOutcome::Busy {
                holder: Some(holder),
                ttl: lease.left,
            }
        },
    )
}

#[cfg(test)]
#[path = "decision_cases.rs"]
pub(crate) mod cases;
