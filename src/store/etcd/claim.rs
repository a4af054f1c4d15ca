//! Claims on etcd: read the claim's keys, decide, and write the claim record and the lease key in one
//! transaction that holds only if none of the keys read changed since.
//!
//! One claim is three requests: a read of its keys (`snapshot.rs`: the series' claim record, the job's
//! lease key and pause, a trigger's request key), an etcd lease grant with the lock's TTL (only when the
//! claim may be taken), and the compare-and-swap:
//!
//! ```text
//! if   mod_revision(k) == seen(k)  for every key read                      (0: the key does not exist)
//! then put claim = "<T> <value>";  put lease = <value> bound to the etcd lease
//! else get every key read                                                  (decide again on what is there)
//! ```
//!
//! The read said that the job is not paused, that no other claimant confirmed `T` or a later tick in the
//! series and that no other claimant holds the lease key; the compares make that still true when the
//! writes apply, since etcd applies transactions one at a time in revision order. So a record of `T` is
//! written for one claimant only (G1), the record's tick never goes down (G1′), nothing is granted once a
//! pause is committed, and the revision of the write — the token — is above that of every grant before it
//! in every series (G2), with no clock in the argument. A transaction whose answer is lost, or that was
//! refused because a copy of it sent to another member applied first (`cluster.rs`), is settled by the
//! record read back: this attempt's value written since the compared read is a grant, with the record's
//! `mod_revision` as its token.
//!
//! The record of a trigger or a retry attempt (a one-off instance, [`crate::lock::Series`]) is bound to an
//! etcd lease of its window plus [`crate::lock::ONE_OFF_RECORD_KEEP`], so etcd drops it by itself; why
//! that cannot let a second claimant in is argued in `docs/protocol.md`, *The etcd store*.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt as _};

use super::snapshot::{decide, record_value, Keys, Snapshot};
use super::EtcdStore;
use crate::clock::boot::BootInstant;
use crate::lock::keys::{attempt_value, Holder};
use crate::lock::{validity, ClaimOutcome, ClaimRequest, Lease};
use crate::store::Claims;

/// What the compare-and-swap did.
enum Written {
    /// Applied, at this revision.
    Applied(i64),
    /// Refused: the keys changed since they were read; this is what they hold now.
    Changed(Snapshot),
}

/// The etcd leases one claim was granted: the lock's, and the one-off record's.
#[derive(Clone, Copy)]
struct Granted {
    lease: i64,
    record: Option<i64>,
}

impl EtcdStore {
    /// Claims one request: read, decide, grant, compare-and-swap; retried on a change between read and
    /// write up to `retries` more times.
    async fn claim(&self, request: &ClaimRequest) -> ClaimOutcome {
        let settings = &self.settings;
        let keys = Keys::of(&settings.key_prefix, request);
        // The stopwatch starts before the etcd lease can be granted, so the validity computed from it
        // never outlives the lease on the leader's clock (under the bounded drift rate).
        let start = BootInstant::now();
        let deadline = start
            + settings
                .ttl
                .saturating_sub(validity::drift(settings.ttl, settings.drift_factor));
        let mut snapshot = match self.read(&keys).await {
            Ok(snapshot) => snapshot,
            Err(why) => return ClaimOutcome::NoQuorum(self.failure(why)),
        };
        let value = attempt_value(
            &request.claimant,
            request.tick,
            &request.fingerprint,
            &request.series,
        );
        let mut granted: Option<Granted> = None;
        for _ in 0..=settings.retries {
            let released = |value: &str| self.was_released(value);
            if let Some(outcome) = decide(request, &snapshot, settings.retry_delay, &released) {
                self.unused(granted);
                return outcome;
            }
            let ids = match granted {
                Some(ids) => ids,
                None => match self.grant(request).await {
                    Ok(ids) => *granted.insert(ids),
                    Err(why) => return ClaimOutcome::NoQuorum(self.failure(why)),
                },
            };
            let written = self.write(&keys, &snapshot, request, &value, ids).await;
            let now = match written {
                Ok(Written::Applied(revision)) => {
                    return self.won(request, revision, value, ids.lease, deadline)
                }
                // Refused: perhaps because this very write applied already (a copy of it sent to another
                // member while the first went unanswered, see `cluster.rs`).
                Ok(Written::Changed(now)) => now,
                // The answer was lost: the writes may or may not have applied.
                Err(why) => match self.read(&keys).await {
                    Ok(now) => now,
                    Err(_) => {
                        // The record's etcd lease is left to expire: the write may have bound it.
                        self.revoke_later(ids.lease);
                        return ClaimOutcome::NoQuorum(self.failure(why));
                    }
                },
            };
            // Whether the writes applied, the record says: it holds this attempt's value, written since
            // the read they compared with (an earlier claim of the same claimant wrote the same value).
            let compared = snapshot.claim.as_ref().map_or(0, |seen| seen.mod_revision);
            match &now.claim {
                Some(record)
                    if record.value == record_value(request.tick, &value)
                        && record.mod_revision > compared =>
                {
                    let revision = record.mod_revision;
                    return self.won(request, revision, value, ids.lease, deadline);
                }
                _ => snapshot = now,
            }
        }
        self.unused(granted);
        // The keys kept changing under us (other workers' claims of this job): not final, try again.
        ClaimOutcome::Contended {
            holder: snapshot
                .lease
                .as_ref()
                .map(|lease| Holder::from_value(&lease.value)),
            retry_in: settings.retry_delay,
        }
    }

    /// The etcd leases a claim of `request` binds: one with the lock's TTL for the lease key, and for a
    /// one-off instance one for its record, of its window plus [`crate::lock::ONE_OFF_RECORD_KEEP`]
    /// (a duration from the request's tick, so no clock is read).
    async fn grant(&self, request: &ClaimRequest) -> Result<Granted, String> {
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
    fn unused(&self, granted: Option<Granted>) {
        if let Some(ids) = granted {
            self.revoke_later(ids.lease);
            if let Some(record) = ids.record {
                self.revoke_later(record);
            }
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
        // A revision is an i64 above 0, so the token is exact and at most MAX_TOKEN; one that is not (a
        // broken answer) gives no grant rather than the token 0.
        let Some(token) = u64::try_from(revision).ok().filter(|token| *token > 0) else {
            self.revoke_later(id);
            let why = format!("etcd answered the revision {revision}");
            return ClaimOutcome::NoQuorum(self.failure(why));
        };
        self.remember(&value, id);
        ClaimOutcome::Won(Lease::new(request, token, value, deadline))
    }

    /// The claim's keys, read in one read-only transaction (one linearizable snapshot).
    async fn read(&self, keys: &Keys) -> Result<Snapshot, String> {
        let txn = keys.read();
        let answer = self.txn(self.settings.node_timeout, txn).await?;
        Snapshot::from_responses(keys, answer.op_responses().as_slice())
    }

    /// The compare-and-swap of a claim (see the module's doc).
    async fn write(
        &self,
        keys: &Keys,
        seen: &Snapshot,
        request: &ClaimRequest,
        value: &str,
        ids: Granted,
    ) -> Result<Written, String> {
        let revision =
            |seen: &Option<super::snapshot::Seen>| seen.as_ref().map_or(0, |s| s.mod_revision);
        let seen_revisions = [&seen.claim, &seen.lease, &seen.paused, &seen.anchor].map(revision);
        let compares: Vec<Compare> = keys
            .all()
            .zip(seen_revisions)
            .map(|(key, seen)| Compare::mod_revision(key, CompareOp::Equal, seen))
            .collect();
        let record_options = ids.record.map(|id| PutOptions::new().with_lease(id));
        let txn = Txn::new()
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
            ])
            .or_else(keys.gets());
        let answer = self.txn(self.settings.node_timeout, txn).await?;
        if answer.succeeded() {
            let revision = answer.header().map(|h| h.revision()).unwrap_or(0);
            return Ok(Written::Applied(revision));
        }
        Snapshot::from_responses(keys, answer.op_responses().as_slice()).map(Written::Changed)
    }
}

impl Claims for EtcdStore {
    /// Claims every request, each on its own (etcd orders them); see [`crate::store::Store::claim_many`].
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        join_all(requests.iter().map(|request| self.claim(request))).await
    }

    /// Claims every request like [`EtcdStore::claim_many`], handing each outcome to `decided` (with the
    /// request's index) as soon as its own transaction is decided; see [`crate::store::Store::claim_each`].
    async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        let mut claims: FuturesUnordered<_> = (requests.iter().enumerate())
            .map(|(index, request)| async move { (index, self.claim(request).await) })
            .collect();
        while let Some((index, outcome)) = claims.next().await {
            decided(index, outcome);
        }
    }
}
