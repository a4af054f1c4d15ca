//! Claims, renewals and releases on the SQL store: the Lua scripts' rules
//! ([`crate::store::redis::scripts`]) as SQL, a batch of claims in one transaction per chunk.
//!
//! A claim first locks its job's fence row (`SELECT … FOR UPDATE`; created at 0 on the job's first claim),
//! which every other transaction deciding on the job's claims or pause also takes first, then locks the
//! lease row it may replace, then reads the database's clock, the job's pause and the series' claim
//! record. It does `ACQUIRE`'s checks and `CONFIRM`'s writes at once, as the embedded store does: the
//! one rule, [`crate::lock::decision::decide`], on what it read, with the database's clock as the store's;
//! then the fence counter goes to
//! `max(fence + 1, token floor)` (refused past [`crate::lock::keys::MAX_TOKEN`]), the claim record to
//! this tick and attempt, and the lease to this attempt until the database's clock plus the TTL.
//!
//! Why a tick is confirmed for one claimant only and tokens strictly increase: the fence row's lock is
//! held from the first read of the job's state to the commit, so two transactions deciding on one job
//! run one after the other, and under `READ COMMITTED` the second reads what the first committed. The
//! lease row is locked too, since a renewal or a release changes it without the fence lock: a renewal
//! either commits before the claim reads the lease (which is then found held) or waits for the claim's
//! commit and then finds another value there (and fails).
//!
//! Every chunk takes its fence rows in the order of their keys, so two workers' chunks never wait for
//! each other in a cycle (a deadlock the server still reports is run again: [`SqlStore::transaction`]).
//! A commit whose answer was lost is settled by reading the claim records back: a claim whose record
//! holds this attempt's value was won; any other is answered `NoQuorum`, and a retry by the same claimant
//! wins it again if it had committed after all. The claim record keeps the token it was granted with, so
//! the read-back hands out that token, never a later claim's.

use std::sync::Arc;

use futures_util::StreamExt as _;
use sqlx::AnyConnection;

use super::{Failed, SqlStore};
use crate::clock::boot::BootInstant;
use crate::lock::decision::{decide, Anchor, ClaimView, Decision, LeaseSeen, Record};
use crate::lock::keys::{attempt_value, claim_keys, lease_key, next_token};
use crate::lock::{validity, ClaimOutcome, ClaimRequest, Lease, Pause, RenewError};
use crate::schedule::Tick;
use crate::store::{Claims, Leases};

/// Claims per transaction: a chunk is answered when it commits, so a herd's first claims start before
/// its last are decided; the chunks of a batch run on several connections at once.
const CHUNK: usize = 32;

/// How many chunks of one batch run at once (each on its own connection, within the pool's size).
const CHUNKS_AT_ONCE: usize = 4;

impl Claims for SqlStore {
    /// Claims every request; see [`crate::store::Store::claim_many`].
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        let mut outcomes: Vec<Option<ClaimOutcome>> = requests.iter().map(|_| None).collect();
        self.claim_each(requests, |index, outcome| outcomes[index] = Some(outcome))
            .await;
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| ClaimOutcome::unanswered(1)))
            .collect()
    }

    /// Claims the requests in chunks of [`CHUNK`], one transaction each, handing each chunk's outcomes to
    /// `decided` as soon as it commits. A failed transaction answers `NoQuorum` for each of its claims,
    /// to be retried.
    async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        if requests.is_empty() {
            return;
        }
        let prefix = &self.shared.settings.key_prefix;
        let mut order: Vec<(String, usize)> = requests
            .iter()
            .enumerate()
            .map(|(index, r)| {
                let [_, fence, ..] = claim_keys(prefix, &r.job, r.tick, r.overlap, &r.series);
                (fence, index)
            })
            .collect();
        order.sort();
        let chunks: Vec<Vec<usize>> = order
            .chunks(CHUNK)
            .map(|chunk| chunk.iter().map(|(_, index)| *index).collect())
            .collect();
        let mut answers = futures_util::stream::iter(chunks)
            .map(|indices| {
                let chunk: Arc<[ClaimRequest]> =
                    indices.iter().map(|&i| requests[i].clone()).collect();
                async move { (indices, self.claim_chunk(chunk).await) }
            })
            .buffer_unordered(CHUNKS_AT_ONCE);
        while let Some((indices, outcomes)) = answers.next().await {
            for (index, outcome) in indices.into_iter().zip(outcomes) {
                decided(index, outcome);
            }
        }
    }
}

impl SqlStore {
    /// One chunk of claims in one transaction, answered in order.
    async fn claim_chunk(&self, chunk: Arc<[ClaimRequest]>) -> Vec<ClaimOutcome> {
        let started = BootInstant::now();
        // Drawn once, before the transaction: a read-back must look for the value the commit wrote.
        let values: Arc<[String]> = chunk
            .iter()
            .map(|r| attempt_value(&r.claimant, r.tick, &r.fingerprint, &r.series))
            .collect();
        let store = self.clone_handle();
        let work_chunk = Arc::clone(&chunk);
        let work_values = Arc::clone(&values);
        let decided = self
            .transaction(self.budget(), move |connection| {
                let (store, chunk) = (store.clone_handle(), Arc::clone(&work_chunk));
                let values = Arc::clone(&work_values);
                Box::pin(async move {
                    let mut outcomes = Vec::with_capacity(chunk.len());
                    for (request, value) in chunk.iter().zip(values.iter()) {
                        outcomes.push(store.claim_one(connection, request, value, started).await?);
                    }
                    Ok(outcomes)
                })
            })
            .await;
        match decided {
            Ok(outcomes) => outcomes,
            Err(Failed::Unknown(why)) => self.read_back(&chunk, &values, started, &why).await,
            Err(Failed::Denied(why)) => {
                let fault = self.permission_fault(why);
                chunk
                    .iter()
                    .map(|_| ClaimOutcome::Fault(fault.clone()))
                    .collect()
            }
            Err(failed) => {
                let failure = self.failure(failed);
                chunk
                    .iter()
                    .map(|_| ClaimOutcome::NoQuorum(failure.clone()))
                    .collect()
            }
        }
    }

    /// Both rounds of one claim at once, inside the chunk's transaction (see the module); `value` is
    /// this attempt's lease value.
    async fn claim_one(
        &self,
        connection: &mut AnyConnection,
        request: &ClaimRequest,
        value: &str,
        started: BootInstant,
    ) -> Result<ClaimOutcome, sqlx::Error> {
        let settings = &self.shared.settings;
        let tick = request.tick.as_millis();
        let [lease_key, fence_key, claim_key, _] = claim_keys(
            &settings.key_prefix,
            &request.job,
            request.tick,
            request.overlap,
            &request.series,
        );
        let fence = self.lock_fence(connection, &fence_key).await?;
        let lease: Option<(String, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql(
                "SELECT {short_value}, expires_us FROM {leases} WHERE lock_key = ? FOR UPDATE",
            )))
            .bind(&lease_key)
            .fetch_optional(&mut *connection)
            .await?;
        let (now_us, pause, record_tick, record): (i64, Option<String>, Option<i64>, Option<String>) =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql(
                "SELECT {now_us},
                    (SELECT {short_value} FROM {paused} WHERE job = ? AND (until_ms IS NULL OR until_ms > {now_ms})),
                    (SELECT tick FROM {claims} WHERE lock_key = ? AND (expires_ms IS NULL OR expires_ms > {now_ms})),
                    (SELECT {short_value} FROM {claims} WHERE lock_key = ? AND (expires_ms IS NULL OR expires_ms > {now_ms}))",
            )))
            .bind(&request.job)
            .bind(&claim_key)
            .bind(&claim_key)
            .fetch_one(&mut *connection)
            .await?;
        let seen = ClaimView {
            pause: pause.as_deref().map(Pause::from_value),
            // A record's value too long to read (`{short_value}`) proves no tick free.
            record: record_tick.map(|claimed| match &record {
                Some(value) => Record::Claimed {
                    tick: Tick(claimed),
                    value,
                },
                None => Record::Unreadable,
            }),
            anchor: Anchor::Unchecked,
            now_ms: now_us.div_euclid(1000),
            check_ahead: true,
            lease: lease.as_ref().and_then(|(value, expires_us)| {
                let left_us = expires_us.saturating_sub(now_us);
                (left_us > 0).then(|| LeaseSeen {
                    value,
                    left: Some(std::time::Duration::from_micros(left_us.unsigned_abs())),
                    replaceable: true,
                })
            }),
        };
        if let Decision::Answer(outcome) = decide(request, &seen, settings.retry_delay) {
            return Ok(outcome);
        }
        let token = match next_token(u64::try_from(fence).unwrap_or(0), request.tick) {
            Ok(token) => token,
            Err(refusal) => return Ok(ClaimOutcome::Refused(refusal)),
        };
        // At most MAX_TOKEN, so it is the same number as a BIGINT.
        let stored = i64::try_from(token).unwrap_or(i64::MAX);
        let value = value.to_string();
        sqlx::query(sqlx::AssertSqlSafe(
            self.sql("UPDATE {fences} SET token = ? WHERE lock_key = ?"),
        ))
        .bind(stored)
        .bind(&fence_key)
        .execute(&mut *connection)
        .await?;
        let dialect = &self.shared.dialect;
        sqlx::query(sqlx::AssertSqlSafe(dialect.upsert(
            "claims",
            &["lock_key", "tick", "value", "token", "expires_ms"],
            1,
        )))
        .bind(&claim_key)
        .bind(tick)
        .bind(&value)
        .bind(stored)
        .bind(request.record_expires_at())
        .execute(&mut *connection)
        .await?;
        let ttl_us = i64::try_from(settings.ttl.as_micros()).unwrap_or(i64::MAX);
        sqlx::query(sqlx::AssertSqlSafe(dialect.upsert(
            "leases",
            &["lock_key", "value", "expires_us"],
            1,
        )))
        .bind(&lease_key)
        .bind(&value)
        .bind(now_us.saturating_add(ttl_us))
        .execute(&mut *connection)
        .await?;
        let drift = validity::drift(settings.ttl, settings.drift_factor);
        Ok(ClaimOutcome::Won(Lease::new(
            request,
            token,
            value,
            started + settings.ttl.saturating_sub(drift),
        )))
    }

    /// The job's fence counter, its row locked to the end of the transaction (created at 0 on the job's
    /// first claim).
    pub(super) async fn lock_fence(
        &self,
        connection: &mut AnyConnection,
        fence_key: &str,
    ) -> Result<i64, sqlx::Error> {
        let select = self.sql("SELECT token FROM {fences} WHERE lock_key = ? FOR UPDATE");
        let found: Option<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(select.clone()))
            .bind(fence_key)
            .fetch_optional(&mut *connection)
            .await?;
        if let Some((token,)) = found {
            return Ok(token);
        }
        sqlx::query(sqlx::AssertSqlSafe(
            self.shared
                .dialect
                .insert_new("fences", &["lock_key", "token"]),
        ))
        .bind(fence_key)
        .bind(0_i64)
        .execute(&mut *connection)
        .await?;
        let (token,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(select))
            .bind(fence_key)
            .fetch_one(&mut *connection)
            .await?;
        Ok(token)
    }

    /// The outcomes of a chunk whose commit's answer was lost: each claim whose record holds the value
    /// this attempt would have written was won; the others are `NoQuorum` (see the module).
    async fn read_back(
        &self,
        chunk: &[ClaimRequest],
        values: &[String],
        started: BootInstant,
        why: &str,
    ) -> Vec<ClaimOutcome> {
        let prefix = self.shared.settings.key_prefix.clone();
        let keys: Vec<String> = chunk
            .iter()
            .map(|r| {
                let [_, _, claim, _] = claim_keys(&prefix, &r.job, r.tick, r.overlap, &r.series);
                claim
            })
            .collect();
        let sql = self.sql("SELECT value, token FROM {claims} WHERE lock_key = ?");
        let read = self
            .with_connection(self.budget(), move |connection| {
                Box::pin(async move {
                    let mut found = Vec::with_capacity(keys.len());
                    for claim in &keys {
                        let row: Option<(String, i64)> =
                            sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
                                .bind(claim)
                                .fetch_optional(&mut *connection)
                                .await?;
                        found.push(row);
                    }
                    Ok(found)
                })
            })
            .await;
        let settings = &self.shared.settings;
        let lost = self.failure(format!("{why}; reading the claims back: "));
        match read {
            Ok(found) => chunk
                .iter()
                .zip(values)
                .zip(found)
                .map(|((request, value), record)| match record {
                    Some((record, token)) if record == *value => {
                        let drift = validity::drift(settings.ttl, settings.drift_factor);
                        ClaimOutcome::Won(Lease::new(
                            request,
                            u64::try_from(token).unwrap_or(0),
                            value.clone(),
                            started + settings.ttl.saturating_sub(drift),
                        ))
                    }
                    _ => ClaimOutcome::NoQuorum(
                        self.failure(format!("{why}; read back: this claim did not commit")),
                    ),
                })
                .collect(),
            Err(failed) => {
                let mut failure = lost;
                if let Some((_, text)) = failure.failures.first_mut() {
                    text.push_str(&failed.to_string());
                }
                chunk
                    .iter()
                    .map(|_| ClaimOutcome::NoQuorum(failure.clone()))
                    .collect()
            }
        }
    }
}

impl Leases for SqlStore {
    /// Extends the lease by a full TTL from the database's clock if this attempt still holds it and it
    /// has not expired there; see [`crate::store::Store::renew`]. One statement, judged by the rows it
    /// matched (sqlx asks MySQL for matched rows, `CLIENT_FOUND_ROWS`, so a renewal that writes the value
    /// already there still counts).
    async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        lease.start_renewal()?;
        let key = lease_key(&self.shared.settings.key_prefix, lease);
        let value = lease.value.clone();
        let settings = &self.shared.settings;
        let ttl_us = i64::try_from(settings.ttl.as_micros()).unwrap_or(i64::MAX);
        let sql = self.sql(
            "UPDATE {leases} SET expires_us = {now_us} + ?
             WHERE lock_key = ? AND value = ? AND expires_us > {now_us}",
        );
        let started = BootInstant::now();
        let renewed = self
            .with_connection(self.budget(), move |connection| {
                Box::pin(async move {
                    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(ttl_us)
                        .bind(key)
                        .bind(value)
                        .execute(connection)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await;
        match renewed {
            // As on Redis: a renewal confirmed after the deadline proves nothing about the time between.
            Ok(true) if BootInstant::now() >= lease.deadline() => {
                lease.mark_lost();
                Err(RenewError::Expired)
            }
            Ok(true) => {
                let drift = validity::drift(settings.ttl, settings.drift_factor);
                lease.extend_to(started + settings.ttl.saturating_sub(drift));
                Ok(())
            }
            Ok(false) => {
                lease.mark_lost();
                Err(RenewError::NotHeld(self.failure("lease not held")))
            }
            Err(failed) => Err(RenewError::Unconfirmed(self.failure(failed))),
        }
    }

    /// At once, as [`Leases::release`]: one statement, nothing to gather it with.
    async fn release_soon(&self, lease: &Lease) {
        Leases::release(self, lease).await
    }

    /// Deletes the lease if it is still this lease's value; the claim record and the fence counter stay. A
    /// failure is not reported: the lease then expires after its TTL.
    async fn release(&self, lease: &Lease) {
        let key = lease_key(&self.shared.settings.key_prefix, lease);
        let value = lease.value.clone();
        let sql = self.sql("DELETE FROM {leases} WHERE lock_key = ? AND value = ?");
        let _ = self
            .with_connection(self.budget(), move |connection| {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(key)
                        .bind(value)
                        .execute(connection)
                        .await?;
                    Ok(())
                })
            })
            .await;
    }

    /// Never: a lease of the SQL store ends only as its renewals say.
    fn lease_gone<'a>(
        &'a self,
        _lease: &Lease,
    ) -> impl std::future::Future<Output = ()> + Send + use<'a> {
        std::future::pending()
    }
}
