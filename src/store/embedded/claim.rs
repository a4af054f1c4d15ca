//! Claims, renewals and releases on the embedded store: the Lua scripts' rules
//! ([`crate::store::redis::scripts`]) as SQL, each call one `BEGIN IMMEDIATE` transaction.
//!
//! A claim reads the job's pause (its row in `paused`, until it expires), the series' claim record and
//! the lease (unless it expired or was taken in another boot), and decides on them by the one rule,
//! [`crate::lock::decision::decide`], with this host's wall clock as the store's; then the fence counter goes to `max(fence + 1, token floor)` (exact; refused
//! past [`crate::lock::keys::MAX_TOKEN`]), the claim record to this tick and attempt, and the lease to this
//! attempt for a TTL. Since the transaction holds the database's write lock from its first read to its
//! commit, what it read is still true when it writes, in whichever process it runs — a tick is confirmed
//! for one claimant only and tokens strictly increase. The time is read inside the transaction,
//! after any wait for the lock, so a wait never shortens a lease below what the holder believes.

use rusqlite::{params, OptionalExtension as _, Transaction};

use super::{nanos, now_ms, EmbeddedStore, Failed, Shared};
use crate::clock::boot::BootInstant;
use crate::lock::decision::{decide, Anchor, ClaimView, Decision, LeaseSeen, Record};
use crate::lock::keys::{attempt_value, claim_keys, lease_key, next_token};
use crate::lock::{validity, ClaimOutcome, ClaimRequest, Lease, RenewError};
use crate::schedule::Tick;
use crate::store::{Claims, Leases};

impl Leases for EmbeddedStore {
    /// Extends the lease by a full TTL if this attempt still holds it and it has not expired; see
    /// [`crate::store::Store::renew`].
    async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        lease.start_renewal()?;
        let key = lease_key(&self.shared.settings.key_prefix, lease);
        let value = lease.value.clone();
        let renewed = self
            .write_checked(move |shared, transaction| {
                let now = BootInstant::now();
                let expires = nanos(now + shared.settings.ttl);
                let changed = transaction.execute(
                    "UPDATE leases SET expires_ns = ?1
                     WHERE key = ?2 AND value = ?3 AND boot_id = ?4 AND expires_ns > ?5",
                    params![expires, key, value, shared.boot_id, nanos(now)],
                )?;
                Ok((changed == 1).then_some(now))
            })
            .await;
        match renewed {
            // As on Redis: a renewal confirmed after the deadline proves nothing about the time between.
            Ok(Some(_)) if BootInstant::now() >= lease.deadline() => {
                lease.mark_lost();
                Err(RenewError::Expired)
            }
            Ok(Some(now)) => {
                let ttl = self.shared.settings.ttl;
                let drift = validity::drift(ttl, self.shared.settings.drift_factor);
                lease.extend_to(now + ttl.saturating_sub(drift));
                Ok(())
            }
            Ok(None) => {
                lease.mark_lost();
                let failure = self.shared.failure("lease not held".to_string());
                Err(RenewError::NotHeld(failure))
            }
            // A lease on a file no other worker opens now excludes nobody: lost at once, so the run
            // stops now rather than at its deadline (another worker may already run the job).
            Err(Failed::Fault(fault)) => {
                lease.mark_lost();
                Err(RenewError::NotHeld(self.shared.failure(fault.to_string())))
            }
            Err(Failed::Node(why)) => Err(RenewError::Unconfirmed(self.shared.failure(why))),
        }
    }

    /// At once, as [`Leases::release`]: there is nothing to gather a release with here.
    async fn release_soon(&self, lease: &Lease) {
        Leases::release(self, lease).await
    }

    /// Deletes the lease if it is still this lease's value (compare-and-delete); the claim record and the
    /// fence counter stay. A failure is not reported: the lease then expires after its TTL.
    async fn release(&self, lease: &Lease) {
        let key = lease_key(&self.shared.settings.key_prefix, lease);
        let value = lease.value.clone();
        let _ = self
            .write(move |_, transaction| {
                transaction.execute(
                    "DELETE FROM leases WHERE key = ?1 AND value = ?2",
                    params![key, value],
                )
            })
            .await;
    }

    /// Never: a lease of the embedded store ends only as its renewals say.
    fn lease_gone<'a>(
        &'a self,
        _lease: &Lease,
    ) -> impl std::future::Future<Output = ()> + Send + use<'a> {
        std::future::pending()
    }
}

impl Claims for EmbeddedStore {
    /// Claims every request in one transaction; see [`crate::store::Store::claim_many`]. A failed
    /// transaction (the database busy or unwritable) answers `NoQuorum` for each, to be retried; a file
    /// that is no longer the path's answers [`ClaimOutcome::Fault`] for each, and claims nothing.
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        if requests.is_empty() {
            return Vec::new();
        }
        let owned = requests.to_vec();
        let claimed = self
            .write_checked(move |shared, transaction| {
                shared.drop_expired_leases(transaction)?;
                owned
                    .iter()
                    .map(|request| shared.claim(transaction, request))
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .await;
        match claimed {
            Ok(outcomes) => outcomes,
            Err(Failed::Fault(fault)) => requests
                .iter()
                .map(|_| ClaimOutcome::Fault(fault.clone()))
                .collect(),
            Err(Failed::Node(why)) => {
                let failure = self.shared.failure(why);
                requests
                    .iter()
                    .map(|_| ClaimOutcome::NoQuorum(failure.clone()))
                    .collect()
            }
        }
    }

    /// Hands each outcome of [`Claims::claim_many`] to `decided`: one transaction decides the whole batch
    /// at once, so there is nothing to hand out earlier.
    async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        let outcomes = self.claim_many(requests).await;
        outcomes
            .into_iter()
            .enumerate()
            .for_each(|(index, outcome)| decided(index, outcome));
    }
}

impl Shared {
    /// Deletes the leases that expired (or were taken in another boot), the claim records of triggers and
    /// retries past their expiry, and pauses that ended, as Redis drops a key after its TTL: those of
    /// crashed holders with `overlap: allow`, one per tick, and the one-off claim records would otherwise
    /// pile up. The tables hold little beyond what is live, so this costs little; expired rows count as
    /// absent anyway.
    fn drop_expired_leases(&self, transaction: &Transaction) -> rusqlite::Result<()> {
        transaction
            .prepare_cached("DELETE FROM leases WHERE expires_ns <= ?1 OR boot_id != ?2")?
            .execute(params![nanos(BootInstant::now()), self.boot_id])?;
        transaction
            .prepare_cached("DELETE FROM claims WHERE expires_ms <= ?1")?
            .execute([now_ms()])?;
        transaction
            .prepare_cached("DELETE FROM paused WHERE until_ms <= ?1")?
            .execute([now_ms()])?;
        Ok(())
    }

    /// Both rounds of one claim at once: `ACQUIRE`'s checks, then `CONFIRM`'s writes.
    fn claim(
        &self,
        transaction: &Transaction,
        request: &ClaimRequest,
    ) -> rusqlite::Result<ClaimOutcome> {
        let now = BootInstant::now();
        let ttl = self.settings.ttl;
        let tick = request.tick.as_millis();
        let [lease_key, fence_key, claim_key, _] = claim_keys(
            &self.settings.key_prefix,
            &request.job,
            request.tick,
            request.overlap,
            &request.series,
        );
        let pause = self.pause_of(transaction, &request.job)?;
        let record: Option<(i64, String)> = transaction
            .prepare_cached("SELECT tick, value FROM claims WHERE key = ?1")?
            .query_row([&claim_key], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let lease: Option<(String, String, i64)> = transaction
            .prepare_cached("SELECT value, boot_id, expires_ns FROM leases WHERE key = ?1")?
            .query_row([&lease_key], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()?;
        let seen = ClaimView {
            pause,
            record: record.as_ref().map(|(tick, value)| Record::Claimed {
                tick: Tick(*tick),
                value,
            }),
            anchor: Anchor::Unchecked,
            now_ms: now_ms(),
            check_ahead: true,
            lease: lease.as_ref().and_then(|(value, boot_id, expires_ns)| {
                let left = self.left(boot_id, *expires_ns, now)?;
                Some(LeaseSeen {
                    value,
                    left: Some(left),
                    replaceable: true,
                })
            }),
        };
        if let Decision::Answer(outcome) = decide(request, &seen, self.settings.retry_delay) {
            return Ok(outcome);
        }
        let fence: Option<i64> = transaction
            .prepare_cached("SELECT token FROM fences WHERE key = ?1")?
            .query_row([&fence_key], |row| row.get(0))
            .optional()?;
        let fence = fence.and_then(|f| u64::try_from(f).ok()).unwrap_or(0);
        let token = match next_token(fence, request.tick) {
            Ok(token) => token,
            Err(refusal) => return Ok(ClaimOutcome::Refused(refusal)),
        };
        // At most MAX_TOKEN, so it is the same number as an INTEGER.
        let stored = i64::try_from(token).unwrap_or(i64::MAX);
        let value = attempt_value(
            &request.claimant,
            request.tick,
            &request.fingerprint,
            &request.series,
        );
        transaction
            .prepare_cached(
                "INSERT INTO fences (key, token) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET token = max(token, excluded.token)",
            )?
            .execute(params![fence_key, stored])?;
        transaction
            .prepare_cached(
                "INSERT INTO claims (key, tick, value, expires_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (key) DO UPDATE SET tick = excluded.tick, value = excluded.value,
                                                 expires_ms = excluded.expires_ms",
            )?
            .execute(params![claim_key, tick, value, request.record_expires_at()])?;
        transaction
            .prepare_cached(
                "INSERT INTO leases (key, value, boot_id, expires_ns) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, boot_id = excluded.boot_id,
                                                 expires_ns = excluded.expires_ns",
            )?
            .execute(params![lease_key, value, self.boot_id, nanos(now + ttl)])?;
        let drift = validity::drift(ttl, self.settings.drift_factor);
        Ok(ClaimOutcome::Won(Lease::new(
            request,
            token,
            value,
            now + ttl.saturating_sub(drift),
        )))
    }
}
