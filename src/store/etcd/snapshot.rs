//! What a claim on etcd reads and decides on: the keys of one claim instance as one snapshot, and the
//! answer that snapshot gives ([`decide`]) — the rules of the Lua scripts on a Redis node.
//!
//! A claim reads up to five keys in one read-only transaction (one linearizable snapshot): the series'
//! claim record, the job's lease key, its pause (`…:paused`), its fence (`…:fence`, the job's last token),
//! and for a trigger its *anchor*, the request key that `redcron trigger` wrote (`triggers.rs`). The
//! compare-and-swap then compares the `mod_revision` of every one of them (0: absent), so a pause, a
//! claim or a forgotten request between the read and the write fails the transaction like any other
//! change.

use etcd_client::{GetResponse, Txn, TxnOp, TxnOpResponse};

use crate::lock::decision::{self, Anchor, ClaimView, Decision, LeaseSeen, Record};
use crate::lock::keys::claim_keys;
use crate::lock::{ClaimOutcome, ClaimRequest, Pause, Series};
use crate::schedule::Tick;

/// A key as read: its value and the revision of its last write.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Seen {
    pub value: String,
    pub mod_revision: i64,
}

/// The keys one claim reads and compares.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    pub claim: String,
    pub lease: String,
    pub paused: String,
    /// The job's fence: the last token granted in any of its series (every grant rewrites it).
    pub fence: String,
    /// A trigger's request key: the claim is refused once it is gone (handled or expired).
    pub anchor: Option<String>,
}

impl Keys {
    /// The keys of `request` under `prefix` ([`claim_keys`], and the request key of a trigger).
    pub fn of(prefix: &str, request: &ClaimRequest) -> Keys {
        let [lease, fence, claim, paused] = claim_keys(
            prefix,
            &request.job,
            request.tick,
            request.overlap,
            &request.series,
        );
        let anchor = match &request.series {
            Series::Trigger(id) => Some(super::triggers::request_key(prefix, id)),
            Series::Schedule | Series::Retry(_) => None,
        };
        Keys {
            claim,
            lease,
            paused,
            fence,
            anchor,
        }
    }

    /// The keys in the order a read (or a refused compare-and-swap) gets them.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        [&self.claim, &self.lease, &self.paused, &self.fence]
            .into_iter()
            .chain(&self.anchor)
            .map(String::as_str)
    }

    /// A get of each key, in [`Keys::all`]'s order.
    pub fn gets(&self) -> Vec<TxnOp> {
        self.all().map(|key| TxnOp::get(key, None)).collect()
    }

    /// The read of all keys as one read-only transaction.
    pub fn read(&self) -> Txn {
        Txn::new().and_then(self.gets())
    }
}

/// The keys of one claim, as one snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Snapshot {
    pub claim: Option<Seen>,
    pub lease: Option<Seen>,
    pub paused: Option<Seen>,
    pub fence: Option<Seen>,
    pub anchor: Option<Seen>,
}

impl Snapshot {
    /// The token a grant on this snapshot carries: `max(fence + 1, token floor of the tick)`
    /// ([`crate::lock::keys::next_token`], as every store computes it), where the fence is the job's last
    /// token (0 when it has none: a job never claimed, or claimed only by workers that took the revision
    /// as the token). A fence that does not parse is taken as 0: the tick's floor is still above every
    /// token of an earlier tick.
    pub fn next_token(&self, tick: Tick) -> Result<u64, crate::lock::Refusal> {
        let fence = self
            .fence
            .as_ref()
            .and_then(|seen| seen.value.parse::<u64>().ok())
            .unwrap_or(0);
        crate::lock::keys::next_token(fence, tick)
    }

    /// The gets of a read (or of a refused compare-and-swap) of `keys`.
    pub fn from_responses(keys: &Keys, responses: &[TxnOpResponse]) -> Result<Snapshot, String> {
        let one = |index: usize| -> Result<Option<Seen>, String> {
            let Some(TxnOpResponse::Get(get)) = responses.get(index) else {
                return Err("unexpected transaction answer".to_string());
            };
            seen(get)
        };
        Ok(Snapshot {
            claim: one(0)?,
            lease: one(1)?,
            paused: one(2)?,
            fence: one(3)?,
            anchor: if keys.anchor.is_some() { one(4)? } else { None },
        })
    }
}

/// The one key a get asked for, if it exists.
pub(super) fn seen(get: &GetResponse) -> Result<Option<Seen>, String> {
    get.kvs()
        .first()
        .map(|kv| {
            let value = kv
                .value_str()
                .map_err(|e| format!("a key holds no text: {e}"))?;
            Ok(Seen {
                value: value.to_string(),
                mod_revision: kv.mod_revision(),
            })
        })
        .transpose()
}

/// The claim record of `tick` for attempt `value`: `<tick ms> <value>`, as on the Redis nodes.
pub(super) fn record_value(tick: Tick, value: &str) -> String {
    format!("{} {value}", tick.as_millis())
}

/// The final or waiting outcome the snapshot gives `request`, or `None` when it may take the tick: the one
/// rule, [`crate::lock::decision::decide`], on what the snapshot holds, with this host's clock for the
/// windows (etcd has no clock to read in a transaction).
///
/// A record that does not parse counts as claimed; a trigger whose request key is gone (handled, or
/// expired) is refused as claimed. A lease key that holds a lease this process `released` (its run ended;
/// the revoke waits for an election) is as free as a deleted one: the compare-and-swap binds the key to
/// the new etcd lease, so the late revoke deletes nothing.
pub(super) fn decide(
    request: &ClaimRequest,
    snapshot: &Snapshot,
    retry_delay: std::time::Duration,
    released: &dyn Fn(&str) -> bool,
) -> Option<ClaimOutcome> {
    let seen = ClaimView {
        pause: snapshot
            .paused
            .as_ref()
            .map(|paused| Pause::from_value(&paused.value)),
        record: snapshot
            .claim
            .as_ref()
            .map(|record| Record::parse(&record.value)),
        anchor: match (&request.series, &snapshot.anchor) {
            (Series::Trigger(_), Some(_)) => Anchor::Present,
            (Series::Trigger(_), None) => Anchor::Gone,
            (Series::Schedule | Series::Retry(_), _) => Anchor::Unchecked,
        },
        now_ms: chrono::Utc::now().timestamp_millis(),
        check_ahead: false,
        lease: snapshot
            .lease
            .as_ref()
            .filter(|lease| !released(&lease.value))
            .map(|lease| LeaseSeen {
                value: &lease.value,
                left: None,
                replaceable: true,
            }),
    };
    match decision::decide(request, &seen, retry_delay) {
        Decision::Take => None,
        Decision::Answer(outcome) => Some(outcome),
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
