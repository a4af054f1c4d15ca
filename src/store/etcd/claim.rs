//! Claims on etcd: read the claim's keys, decide, and write the claim record, the lease key and the
//! job's fence in one transaction that holds only if none of the keys read changed since.
//!
//! A claim is a read of its keys (`snapshot.rs`: the series' claim record, the job's lease key, pause and
//! fence, a trigger's request key), an etcd lease grant with the lock's TTL (only when the claim may be
//! taken), and the compare-and-swap; the claims of a batch share the read and write transactions
//! (`batch.rs`), each with compares of its own:
//!
//! ```text
//! if   mod_revision(k) == seen(k)  for every key read                      (0: the key does not exist)
//! then put claim = "<T> <value>";  put lease = <value> bound to the etcd lease;  put fence = <token>
//! else get every key read                                                  (decide again on what is there)
//! ```
//!
//! The read said that the job is not paused, that no other claimant confirmed `T` or a later tick in the
//! series and that no other claimant holds the lease key; the compares make that still true when the
//! writes apply, since etcd applies transactions one at a time in revision order. So a record of `T` is
//! written for one claimant only (G1), the record's tick never goes down (G1′), and nothing is granted
//! once a pause is committed. The **token** is `max(fence + 1, T_ms × 1000)`
//! ([`crate::lock::keys::next_token`], the other stores' rule) over the fence read, which the
//! transaction rewrites at the `mod_revision` it read: every grant of the job, in every series, rewrites
//! the fence, so of two grants the later read the earlier's token and chose a higher one (G2, with no
//! clock in the argument). The floor keeps tokens rising where etcd forgot writes — a cluster restored
//! from a snapshot restarts its revisions and the fences at the snapshot's, but later ticks start above
//! every token of earlier ones. A transaction whose answer is lost, or that was refused because a copy of
//! it sent to another member applied first (`cluster.rs`), is settled by the keys read back: this
//! attempt's value in the record, written since the compared read, is a grant, whose token is the fence
//! written with it (same `mod_revision`); a fence rewritten since by a later grant leaves the token
//! unknown, and the claim is decided again (the same claimant goes on from its record, with a new token).
//!
//! **One etcd lease per claim, also in a batch.** Sharing one grant among the claims of a batch would
//! save a request per claim, and is not done, for these reasons:
//! - A release revokes the run's etcd lease, which deletes exactly the keys bound to it (`lease.rs`). A
//!   shared lease revoked at one run's end would delete the lease keys of the other runs of the batch
//!   while they still run, and their jobs' next ticks could be granted elsewhere under them.
//! - So with a shared lease a release could only delete its own key (compare and delete), and the lease
//!   would be revoked after the last of its runs; but a shared lease is kept alive while any of its runs
//!   renews it. A run that stopped after its renewals failed, and whose delete did not land (the
//!   election that failed its renewals), would keep its job's lease key for as long as another run of
//!   the batch lasts, not for one TTL: the job busy for every worker, for the length of a stranger's run.
//! - A lease's loss would be every run's: an expiry or an early revoke by etcd (issue 15247, `lease.rs`)
//!   would stop all the batch's runs at once, where each run's lease now lives by its own renewals.
//! - A one-off record's lease lasts from its tick to its window's end plus an hour, which differs from
//!   request to request, so those could be shared only among equal windows.
//!
//! The grants of a batch go out at once (`batch.rs`), each a small request whose Raft entry the leader
//! appends and fsyncs together with the others proposed at the same time.
//!
//! The record of a trigger or a retry attempt (a one-off instance, [`crate::lock::Series`]) is bound to an
//! etcd lease of its window plus [`crate::lock::ONE_OFF_RECORD_KEEP`], so etcd drops it by itself; why
//! that cannot let a second claimant in is argued in `docs/protocol.md`, *The etcd store*.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::snapshot::{record_value, Keys, Snapshot};
use super::EtcdStore;
use crate::clock::boot::BootInstant;
use crate::lock::{ClaimOutcome, ClaimRequest, Lease};
use crate::store::Claims;

/// What the compare-and-swap did.
pub(super) enum Written {
    /// Applied, at this revision.
    Applied(i64),
    /// Refused: the keys changed since they were read; this is what they hold now.
    Changed(Snapshot),
}

/// The etcd leases one claim was granted: the lock's, and the one-off record's.
#[derive(Clone, Copy)]
pub(super) struct Granted {
    pub lease: i64,
    pub record: Option<i64>,
}

impl EtcdStore {
    /// The etcd leases a claim of `request` binds: one with the lock's TTL for the lease key, and for a
    /// one-off instance one for its record, of its window plus [`crate::lock::ONE_OFF_RECORD_KEEP`]
    /// (a duration from the request's tick, so no clock is read).
    pub(super) async fn grant(&self, request: &ClaimRequest) -> Result<Granted, String> {
        let lease = self.grant_lease(self.settings.ttl).await?;
        let keep = request
            .record_expires_at()
            .map(|expires| expires.saturating_sub(request.tick.as_millis()).max(0));
        let record = match keep {
            None => None,
            Some(ms) => {
                let keep = std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
                match self.grant_lease(keep).await {
                    Ok(id) => Some(id),
                    Err(why) => {
                        self.revoke_later(lease);
                        return Err(why);
                    }
                }
            }
        };
        Ok(Granted { lease, record })
    }

    /// One etcd lease of `ttl` (whole seconds, rounded up).
    pub(super) async fn grant_lease(&self, ttl: std::time::Duration) -> Result<i64, String> {
        let ttl = Self::lease_seconds(ttl);
        self.call(self.settings.node_timeout, |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await
        .map(|answer| answer.id())
    }

    /// Revokes the etcd leases of a claim that bound nothing (no write applied).
    pub(super) fn unused(&self, granted: Option<Granted>) {
        if let Some(ids) = granted {
            self.revoke_later(ids.lease);
            if let Some(record) = ids.record {
                self.revoke_later(record);
            }
        }
    }

    /// A grant with `token`, written at `revision`, if the lease's validity is not spent yet; else (a paused process, a slow
    /// cluster) the etcd lease is revoked and the same claimant tries again, finding the record its own.
    pub(super) fn won(
        &self,
        request: &ClaimRequest,
        token: u64,
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
        self.remember(&value, id, revision);
        ClaimOutcome::Won(Lease::new(request, token, value, deadline))
    }

    /// The claim's keys, read in one read-only transaction (one linearizable snapshot).
    pub(super) async fn read(&self, keys: &Keys) -> Result<Snapshot, String> {
        let txn = keys.read();
        let answer = self.txn(self.settings.node_timeout, txn).await?;
        Snapshot::from_responses(keys, answer.op_responses().as_slice())
    }

    /// The compare-and-swap of a claim (see the module's doc), binding the lease key to `ids.lease` and a
    /// one-off record to `ids.record`.
    pub(super) fn cas(
        &self,
        keys: &Keys,
        seen: &Snapshot,
        request: &ClaimRequest,
        value: &str,
        token: u64,
        ids: Granted,
    ) -> Txn {
        let revision =
            |seen: &Option<super::snapshot::Seen>| seen.as_ref().map_or(0, |s| s.mod_revision);
        let seen_revisions = [
            &seen.claim,
            &seen.lease,
            &seen.paused,
            &seen.fence,
            &seen.anchor,
        ]
        .map(revision);
        let compares: Vec<Compare> = keys
            .all()
            .zip(seen_revisions)
            .map(|(key, seen)| Compare::mod_revision(key, CompareOp::Equal, seen))
            .collect();
        let record_options = ids.record.map(|id| PutOptions::new().with_lease(id));
        Txn::new()
            .when(compares)
            .and_then([
                TxnOp::put(
                    keys.claim.as_str(),
                    record_value(request.tick, value),
                    record_options,
                ),
                TxnOp::put(
                    keys.lease.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(ids.lease)),
                ),
                TxnOp::put(keys.fence.as_str(), token.to_string(), None),
            ])
            .or_else(keys.gets())
    }

    /// One compare-and-swap `txn` of the claim of `keys`, alone in its transaction.
    pub(super) async fn write(&self, keys: &Keys, txn: Txn) -> Result<Written, String> {
        let answer = self.txn(self.settings.node_timeout, txn).await?;
        if answer.succeeded() {
            let revision = answer.header().map(|h| h.revision()).unwrap_or(0);
            return Ok(Written::Applied(revision));
        }
        Snapshot::from_responses(keys, answer.op_responses().as_slice()).map(Written::Changed)
    }
}

impl Claims for EtcdStore {
    /// Claims every request in a few transactions (`batch.rs`); see [`crate::store::Store::claim_many`].
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        let mut outcomes: Vec<Option<ClaimOutcome>> = requests.iter().map(|_| None).collect();
        self.claim_batch(requests, &mut |index, outcome| {
            if let Some(slot) = outcomes.get_mut(index) {
                *slot = Some(outcome);
            }
        })
        .await;
        let missing = || ClaimOutcome::unanswered(self.endpoints.len());
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(missing))
            .collect()
    }

    /// Claims every request like [`EtcdStore::claim_many`], handing each outcome to `decided` (with the
    /// request's index) as soon as it is decided; see [`crate::store::Store::claim_each`].
    async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        self.claim_batch(requests, &mut decided).await;
    }
}
