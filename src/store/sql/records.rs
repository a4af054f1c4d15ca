//! Run history and membership on the SQL store, in the same shape as on the embedded store
//! ([`crate::store::embedded`]), with the database's clock where that one reads the host's.
//!
//! History: one row per entry identity (job, [`crate::history::Entry::id`]), replaced by a later version
//! of the same fact; a batch is one transaction that writes its rows in key order (two workers' batches
//! never wait for each other in a cycle), and a write of a tick that checks the bound
//! ([`crate::history::HistorySettings::checks_bound_at`]) cuts its job back to `keep_ticks` once it holds
//! more than [`crate::history::HistorySettings::most_ticks`]. Members: one row per worker, stamped with the
//! database's clock when it announced, alive until that clock passes its heartbeat's expiry (a `stopped`
//! announcement is not alive), dropped once dead for [`KEEP_DEAD`]. Each announcement also sweeps what
//! expired a minute ago or more (leases, the claim records of triggers and retries, pauses, trigger
//! requests), as a Redis node drops keys past their TTL; reads skip what expired anyway.

use chrono::{DateTime, Utc};

use super::SqlStore;
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::membership::{self, Member, KEEP_DEAD};
use crate::store::{skip_note, Read, Records};

/// The longest text read back from a row (an entry with both output tails is well under it): a longer
/// one, written by something else, is skipped with a note rather than read into memory whole.
pub(super) const MAX_VALUE: i64 = 1 << 20;

impl Records for SqlStore {
    /// Keeps `entries`, and each of their jobs within its bound (see the module); see
    /// [`crate::store::Store::record`].
    async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut rows: Vec<(String, String, i64, String)> = entries
            .iter()
            .map(|e| (e.job.clone(), e.id(), e.tick, e.to_json()))
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        rows.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        let settings = self.shared.history.clone();
        let mut jobs: Vec<String> = entries
            .iter()
            .filter(|e| settings.checks_bound_at(e.tick))
            .map(|e| e.job.clone())
            .collect();
        jobs.sort_unstable();
        jobs.dedup();
        let insert = self
            .shared
            .dialect
            .upsert("history", &["job", "id", "tick", "entry"], 2);
        let tick_past = self.sql(
            "SELECT tick FROM {history} WHERE job = ? GROUP BY tick ORDER BY tick DESC LIMIT 1 OFFSET ?",
        );
        let delete = self.sql("DELETE FROM {history} WHERE job = ? AND tick <= ?");
        let keep = i64::try_from(settings.keep_ticks).unwrap_or(i64::MAX);
        let most = i64::try_from(settings.most_ticks()).unwrap_or(i64::MAX);
        let (rows, jobs) = (std::sync::Arc::new(rows), std::sync::Arc::new(jobs));
        self.transaction(self.budget() * 4, move |connection| {
            let (rows, jobs) = (rows.clone(), jobs.clone());
            let (insert, tick_past, delete) = (insert.clone(), tick_past.clone(), delete.clone());
            Box::pin(async move {
                for (job, id, tick, json) in rows.iter() {
                    sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
                        .bind(job)
                        .bind(id)
                        .bind(*tick)
                        .bind(json)
                        .execute(&mut *connection)
                        .await?;
                }
                for job in jobs.iter() {
                    let over: Option<(i64,)> =
                        sqlx::query_as(sqlx::AssertSqlSafe(tick_past.clone()))
                            .bind(job)
                            .bind(most)
                            .fetch_optional(&mut *connection)
                            .await?;
                    if over.is_none() {
                        continue;
                    }
                    let cutoff: Option<(i64,)> =
                        sqlx::query_as(sqlx::AssertSqlSafe(tick_past.clone()))
                            .bind(job)
                            .bind(keep)
                            .fetch_optional(&mut *connection)
                            .await?;
                    if let Some((cutoff,)) = cutoff {
                        sqlx::query(sqlx::AssertSqlSafe(delete.clone()))
                            .bind(job)
                            .bind(cutoff)
                            .execute(&mut *connection)
                            .await?;
                    }
                }
                Ok(())
            })
        })
        .await
        .map_err(|failed| self.failure(failed))
    }

    /// The entries of `query`, newest first, whole ticks up to its limit; see
    /// [`crate::store::Store::history`]. An entry that does not parse, or is longer than [`MAX_VALUE`],
    /// is skipped and named in [`Read::skipped`].
    async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        let since = query.since.map_or(i64::MIN, |t| t.as_millis());
        let until = query.until.map_or(i64::MAX, |t| t.as_millis());
        let limit = i64::try_from(query.limit.max(1)).unwrap_or(i64::MAX);
        let job = query.job.clone();
        let cutoff_sql = self.sql(
            "SELECT tick FROM {history} WHERE job = ? AND tick BETWEEN ? AND ?
             ORDER BY tick DESC LIMIT 1 OFFSET ?",
        );
        let select = self.sql(
            "SELECT tick, CASE WHEN OCTET_LENGTH(entry) <= ? THEN entry END, OCTET_LENGTH(entry)
             FROM {history} WHERE job = ? AND tick BETWEEN ? AND ? ORDER BY tick DESC",
        );
        let rows = self
            .with_reader(self.budget() * 4, move |connection| {
                Box::pin(async move {
                    // The tick of the limit-th newest entry: every entry of it and of newer ticks is read,
                    // so that the merge's order (not the table's) picks the entries of the last tick.
                    let cutoff: Option<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(cutoff_sql))
                        .bind(&job)
                        .bind(since)
                        .bind(until)
                        .bind(limit - 1)
                        .fetch_optional(&mut *connection)
                        .await?;
                    let from = cutoff.map_or(since, |(tick,)| tick.max(since));
                    let rows: Vec<(i64, Option<String>, i64)> =
                        sqlx::query_as(sqlx::AssertSqlSafe(select))
                            .bind(MAX_VALUE)
                            .bind(&job)
                            .bind(from)
                            .bind(until)
                            .fetch_all(&mut *connection)
                            .await?;
                    Ok(rows)
                })
            })
            .await
            .map_err(|failed| self.failure(failed))?;
        // Parsed on a blocking thread: a job's history with large output tails is megabytes of JSON,
        // which would hold a runtime thread (and the claims and renewals waiting for one) as long.
        let (target, limit) = (self.shared.target.clone(), query.limit);
        let parsed = tokio::task::spawn_blocking(move || {
            let (mut entries, mut skipped) = (Vec::new(), Vec::new());
            for (tick, json, length) in rows {
                let read = match json {
                    Some(json) => Entry::from_json(&json).map_err(|e| e.to_string()),
                    None => Err(format!("{length} bytes, more than {MAX_VALUE}")),
                };
                match read {
                    Ok(entry) => entries.push(entry),
                    Err(why) => skipped.push(skip_note(
                        &target,
                        "history entry of tick",
                        &tick.to_string(),
                        &why,
                    )),
                }
            }
            Read::newest(entries, limit, skipped)
        })
        .await;
        parsed.map_err(|e| self.failure(format!("reading the history failed: {e}")))
    }

    /// Keeps `member`'s announcement, stamped with the database's clock, alive for [`Member::ttl`] (a
    /// `stopped` one: not alive); drops members dead for longer than [`KEEP_DEAD`], and sweeps what
    /// expired (see the module); see [`crate::store::Store::announce`].
    async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        let ttl_us = i64::try_from(member.ttl().as_micros()).unwrap_or(i64::MAX);
        let json = serde_json::to_string(member).unwrap_or_default();
        let id = member.id.clone();
        let dialect = &self.shared.dialect;
        // The row's times from the database's clock.
        let upsert = dialect.upsert_values(
            "members",
            &["id", "seen_ms", "member", "expires_us", "expired_ms"],
            &["?", "{now_ms}", "?", "{now_us} + ?", "{now_ms} + ?"],
            1,
        );
        let keep_dead_ms = i64::try_from(KEEP_DEAD.as_millis()).unwrap_or(i64::MAX);
        let sweeps = [
            self.sql("DELETE FROM {members} WHERE expired_ms < {now_ms} - ?"),
            self.sql("DELETE FROM {leases} WHERE expires_us < {now_us} - 60000000"),
            self.sql("DELETE FROM {claims} WHERE expires_ms < {now_ms} - 60000"),
            self.sql("DELETE FROM {paused} WHERE until_ms < {now_ms} - 60000"),
            self.sql("DELETE FROM {triggers} WHERE expires_ms < {now_ms} - 60000"),
        ];
        self.with_connection(self.budget() * 4, move |connection| {
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(upsert))
                    .bind(id)
                    .bind(json)
                    .bind(ttl_us)
                    .bind(ttl_us / 1000)
                    .execute(&mut *connection)
                    .await?;
                for (i, sweep) in sweeps.into_iter().enumerate() {
                    let query = sqlx::query(sqlx::AssertSqlSafe(sweep));
                    let query = if i == 0 {
                        query.bind(keep_dead_ms)
                    } else {
                        query
                    };
                    query.execute(&mut *connection).await?;
                }
                Ok(())
            })
        })
        .await
        .map_err(|failed| self.failure(failed))
    }

    /// Every member alive, and every one dead for less than [`KEEP_DEAD`], sorted by id, alive judged on
    /// the database's clock; see [`crate::store::Store::members`].
    async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        let keep_dead_ms = i64::try_from(KEEP_DEAD.as_millis()).unwrap_or(i64::MAX);
        let select = self.sql(
            "SELECT id, seen_ms, CASE WHEN OCTET_LENGTH(member) <= ? THEN member END,
                    CASE WHEN expires_us > {now_us} THEN 1 ELSE 0 END
             FROM {members} WHERE expires_us > {now_us} OR expired_ms > {now_ms} - ?",
        );
        let rows: Vec<(String, i64, Option<String>, i64)> = self
            .with_reader(self.budget() * 4, move |connection| {
                Box::pin(async move {
                    sqlx::query_as(sqlx::AssertSqlSafe(select))
                        .bind(MAX_VALUE)
                        .bind(keep_dead_ms)
                        .fetch_all(connection)
                        .await
                })
            })
            .await
            .map_err(|failed| self.failure(failed))?;
        let (mut members, mut skipped) = (Vec::new(), Vec::new());
        for (id, seen_ms, json, alive) in rows {
            let read = json
                .ok_or_else(|| format!("longer than {MAX_VALUE} bytes"))
                .and_then(|json| Member::read(&id, &json));
            match read {
                Ok(mut member) => {
                    member.seen_at = DateTime::<Utc>::from_timestamp_millis(seen_ms);
                    member.alive = alive != 0;
                    members.push(member);
                }
                Err(why) => skipped.push(skip_note(&self.shared.target, "member", &id, &why)),
            }
        }
        Ok(Read {
            value: membership::merge([members]),
            missing: Vec::new(),
            skipped,
        })
    }
}
