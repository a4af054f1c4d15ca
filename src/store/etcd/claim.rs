//! Claims on etcd: read the job's claim record and lease key, decide, and write both in one transaction
//! that holds only if neither changed since the read.
//!
//! One claim is three requests: a read of both keys (a read-only transaction: one linearizable snapshot),
//! an etcd lease grant with the lock's TTL (only when the tick is free), and the compare-and-swap:
//!
//! ```text
//! if   mod_revision(claim) == seen  and  mod_revision(lease) == seen       (0: the key does not exist)
//! then put claim = "<T> <value>";  put lease = <value> bound to the etcd lease
//! else get claim; get lease                                                (decide again on what is there)
//! ```
//!
//! The read said that no other claimant confirmed `T` or a later tick and that no other claimant holds the
//! lease key; the compares make that still true when the writes apply, since etcd applies transactions
//! one at a time in revision order. So a record of `T` is written for one claimant only (G1), the
//! record's tick never goes down (G1′), and the revision of the write — the token — is above that of
//! every grant before it (G2), with no clock in the argument. A transaction whose answer is lost is
//! settled by reading the record back: ours (this attempt's value) is a grant, with the record's
//! `mod_revision` as its token.
//!
//! Issue 10's `paused` key goes beside the two keys: read it in [`EtcdStore::read`], refuse in
//! [`decide`], and compare its `mod_revision` in [`EtcdStore::write`], so a pause between the read and the
//! write fails the transaction like any other change.

use etcd_client::{Compare, CompareOp, GetResponse, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::future::join_all;

use super::EtcdStore;
use crate::clock::boot::BootInstant;
use crate::lock::keys::{attempt_value, claim_keys, claimant_of, Holder};
use crate::lock::{validity, ClaimOutcome, ClaimRequest, Lease};
use crate::schedule::Tick;

/// A key as read: its value and the revision of its last write.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Seen {
    pub value: String,
    pub mod_revision: i64,
}

/// The job's claim record and lease key, as one snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Snapshot {
    pub claim: Option<Seen>,
    pub lease: Option<Seen>,
}

/// What the compare-and-swap did.
enum Written {
    /// Applied, at this revision.
    Applied(i64),
    /// Refused: the keys changed since they were read; this is what they hold now.
    Changed(Snapshot),
}

impl EtcdStore {
    /// Claims every request, each on its own (etcd orders them); see [`crate::store::Store::claim_many`].
    pub async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        join_all(requests.iter().map(|request| self.claim(request))).await
    }

    /// Claims one request: read, decide, grant, compare-and-swap; retried on a change between read and
    /// write up to `retries` more times.
    async fn claim(&self, request: &ClaimRequest) -> ClaimOutcome {
        let settings = &self.settings;
        let keys = claim_keys(
            &settings.key_prefix,
            &request.job,
            request.tick,
            request.overlap,
        );
        let (lease_key, claim_key) = (&keys[0], &keys[2]);
        // The stopwatch starts before the etcd lease can be granted, so the validity computed from it
        // never outlives the lease on the leader's clock (under the bounded drift rate).
        let start = BootInstant::now();
        let deadline = start
            + settings
                .ttl
                .saturating_sub(validity::drift(settings.ttl, settings.drift_factor));
        let mut snapshot = match self.read(claim_key, lease_key).await {
            Ok(snapshot) => snapshot,
            Err(why) => return ClaimOutcome::NoQuorum(self.failure(why)),
        };
        let value = attempt_value(&request.claimant, request.tick, &request.fingerprint);
        let mut granted = None;
        for _ in 0..=settings.retries {
            let released = |value: &str| self.was_released(value);
            if let Some(outcome) = decide(request, &snapshot, settings.retry_delay, &released) {
                if let Some(id) = granted {
                    self.revoke_later(id);
                }
                return outcome;
            }
            let id = match granted {
                Some(id) => id,
                None => {
                    let ttl = Self::lease_seconds(settings.ttl);
                    let grant = self
                        .call(settings.node_timeout, |mut c| async move {
                            c.lease_grant(ttl, None).await
                        })
                        .await;
                    match grant {
                        Ok(answer) => *granted.insert(answer.id()),
                        Err(why) => return ClaimOutcome::NoQuorum(self.failure(why)),
                    }
                }
            };
            let written = self
                .write(claim_key, lease_key, &snapshot, request.tick, &value, id)
                .await;
            snapshot = match written {
                Ok(Written::Applied(revision)) => {
                    return self.won(request, revision, value, id, deadline)
                }
                Ok(Written::Changed(now)) => now,
                // The answer was lost: the writes may or may not have applied. What the record holds says.
                Err(why) => match self.read(claim_key, lease_key).await {
                    Ok(now) => match &now.claim {
                        Some(record) if record.value == record_value(request.tick, &value) => {
                            return self.won(request, record.mod_revision, value, id, deadline);
                        }
                        _ => now,
                    },
                    Err(_) => {
                        self.revoke_later(id);
                        return ClaimOutcome::NoQuorum(self.failure(why));
                    }
                },
            };
        }
        if let Some(id) = granted {
            self.revoke_later(id);
        }
        // The keys kept changing under us (other workers' claims of this job): not final, try again.
        ClaimOutcome::Contended {
            holder: snapshot
                .lease
                .as_ref()
                .map(|lease| Holder::from_value(&lease.value)),
            retry_in: settings.retry_delay,
        }
    }

    /// A grant at `revision`, if the lease's validity is not spent yet; else (a paused process, a slow
    /// cluster) the etcd lease is revoked and the same claimant tries again, finding the record its own.
    fn won(
        &self,
        request: &ClaimRequest,
        revision: i64,
        value: String,
        id: i64,
        deadline: BootInstant,
    ) -> ClaimOutcome {
        if BootInstant::now() >= deadline {
            self.revoke_later(id);
            let why = "the claim took longer than the lease's validity".to_string();
            return ClaimOutcome::NoQuorum(self.failure(why));
        }
        self.remember(&value, id);
        let token = u64::try_from(revision).unwrap_or(0);
        ClaimOutcome::Won(Lease::new(request, token, value, deadline))
    }

    /// The claim record and the lease key, read in one read-only transaction (one linearizable snapshot).
    pub(super) async fn read(&self, claim_key: &str, lease_key: &str) -> Result<Snapshot, String> {
        let txn = Txn::new().and_then([TxnOp::get(claim_key, None), TxnOp::get(lease_key, None)]);
        let answer = self
            .call(self.settings.node_timeout, |mut c| async move {
                c.txn(txn).await
            })
            .await?;
        snapshot(&answer.op_responses())
    }

    /// The compare-and-swap of a claim (see the module's doc).
    async fn write(
        &self,
        claim_key: &str,
        lease_key: &str,
        seen: &Snapshot,
        tick: Tick,
        value: &str,
        id: i64,
    ) -> Result<Written, String> {
        let revision = |seen: &Option<Seen>| seen.as_ref().map_or(0, |s| s.mod_revision);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(claim_key, CompareOp::Equal, revision(&seen.claim)),
                Compare::mod_revision(lease_key, CompareOp::Equal, revision(&seen.lease)),
            ])
            .and_then([
                TxnOp::put(claim_key, record_value(tick, value), None),
                TxnOp::put(lease_key, value, Some(PutOptions::new().with_lease(id))),
            ])
            .or_else([TxnOp::get(claim_key, None), TxnOp::get(lease_key, None)]);
        let answer = self
            .call(self.settings.node_timeout, |mut c| async move {
                c.txn(txn).await
            })
            .await?;
        if answer.succeeded() {
            let revision = answer.header().map(|h| h.revision()).unwrap_or(0);
            return Ok(Written::Applied(revision));
        }
        snapshot(&answer.op_responses()).map(Written::Changed)
    }
}

/// The claim record of `tick` for attempt `value`: `<tick ms> <value>`, as on the Redis nodes.
fn record_value(tick: Tick, value: &str) -> String {
    format!("{} {value}", tick.as_millis())
}

/// The two gets of a read (or of a refused compare-and-swap).
fn snapshot(responses: &[TxnOpResponse]) -> Result<Snapshot, String> {
    let one = |response: Option<&TxnOpResponse>| -> Result<Option<Seen>, String> {
        let Some(TxnOpResponse::Get(get)) = response else {
            return Err("unexpected transaction answer".to_string());
        };
        seen(get)
    };
    Ok(Snapshot {
        claim: one(responses.first())?,
        lease: one(responses.get(1))?,
    })
}

/// The one key a get asked for, if it exists.
fn seen(get: &GetResponse) -> Result<Option<Seen>, String> {
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

/// The final or waiting outcome the snapshot gives `request`, or `None` when it may take the tick.
///
/// The rules of the Lua scripts (`crate::store::redis::scripts`): refused if another claimant confirmed
/// this tick or a later one (a record that does not parse counts as claimed: nothing proves the tick
/// free); busy if another tick's run holds the lease key; contended if another claimant of this tick
/// holds it (a plain lease of the same name; a claim writes record and lease at once, so a claimant of
/// this tick with the lease also has the record). Our own claimant's record or lease is ours to go on
/// from: a retry is idempotent. A lease key that holds a lease this process `released` (its run ended;
/// the revoke waits for an election) is as free as a deleted one: the compare-and-swap binds the key to
/// the new etcd lease, so the late revoke deletes nothing.
pub(super) fn decide(
    request: &ClaimRequest,
    snapshot: &Snapshot,
    retry_delay: std::time::Duration,
    released: &dyn Fn(&str) -> bool,
) -> Option<ClaimOutcome> {
    let tick = request.tick.as_millis();
    if let Some(record) = &snapshot.claim {
        let parsed = record
            .value
            .split_once(' ')
            .and_then(|(claimed, value)| Some((claimed.parse::<i64>().ok()?, value)));
        match parsed {
            Some((claimed, value))
                if claimed < tick
                    || (claimed == tick && claimant_of(value) == request.claimant) => {}
            Some((claimed, value)) => {
                let mut by = Holder::from_value(value);
                by.tick = Some(Tick(claimed));
                return Some(ClaimOutcome::AlreadyClaimed { by: Some(by) });
            }
            None => return Some(ClaimOutcome::AlreadyClaimed { by: None }),
        }
    }
    let lease = snapshot.lease.as_ref()?;
    if claimant_of(&lease.value) == request.claimant || released(&lease.value) {
        return None;
    }
    let holder = Holder::from_value(&lease.value);
    Some(if holder.tick == Some(request.tick) {
        ClaimOutcome::Contended {
            holder: Some(holder),
            retry_in: retry_delay,
        }
    } else {
        ClaimOutcome::Busy {
            holder: Some(holder),
            ttl: None,
        }
    })
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
