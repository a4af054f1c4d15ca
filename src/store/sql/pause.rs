//! Pauses on the SQL store: one row per paused job in `paused`, with the instant it ends on the
//! database's clock (`NULL`: until resumed), read by every claim in its transaction. A pause is decided
//! and written in one transaction that first locks the job's fence row, as every claim of the job does:
//! a claim either committed before the pause (its run goes on) or reads the pause (and is refused) — the
//! guarantee of [`crate::store::Pauses::pause`] on one node. A shorter pause never replaces a longer one
//! by accident ([`Pause::decide`], judged on the database's clock).

use chrono::{DateTime, Utc};

use super::records::MAX_VALUE;
use super::SqlStore;
use crate::lock::keys::claim_keys;
use crate::lock::{InForce, Overlap, Pause, PauseOutcome, PauseRead, QuorumFailure};
use crate::schedule::Tick;
use crate::store::{Pauses, Read};

impl Pauses for SqlStore {
    /// Pauses `job` until `pause.until` (or until resumed), unless a pause in force outlasts it (with
    /// [`InForce::KeepLonger`]) or it has ended; see [`crate::store::Store::pause`].
    async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        let [_, fence_key, ..] = claim_keys(
            &self.shared.settings.key_prefix,
            job,
            Tick(0),
            Overlap::Skip,
            &crate::lock::Series::Schedule,
        );
        let (job, pause) = (job.to_string(), pause.clone());
        let read = self.sql(
            "SELECT {now_ms}, (SELECT value FROM {paused} WHERE job = ? AND (until_ms IS NULL OR until_ms > {now_ms}))",
        );
        let write = self
            .shared
            .dialect
            .upsert("paused", &["job", "value", "until_ms"], 1);
        let store = self.clone_handle();
        self.transaction(self.budget() * 2, move |connection| {
            let (store, fence_key, job, pause) = (
                store.clone_handle(),
                fence_key.clone(),
                job.clone(),
                pause.clone(),
            );
            let (read, write) = (read.clone(), write.clone());
            Box::pin(async move {
                store.lock_fence(connection, &fence_key).await?;
                let (now_ms, current): (i64, Option<String>) =
                    sqlx::query_as(sqlx::AssertSqlSafe(read))
                        .bind(&job)
                        .fetch_one(&mut *connection)
                        .await?;
                let current = current.as_deref().map(Pause::from_value);
                let now = DateTime::<Utc>::from_timestamp_millis(now_ms).unwrap_or_else(Utc::now);
                let outcome = pause.decide(current.as_ref(), in_force, now);
                if outcome == PauseOutcome::Paused {
                    sqlx::query(sqlx::AssertSqlSafe(write))
                        .bind(&job)
                        .bind(pause.to_value())
                        .bind(pause.until.map(|until| until.timestamp_millis()))
                        .execute(&mut *connection)
                        .await?;
                }
                Ok(outcome)
            })
        })
        .await
        .map_err(|failed| self.failure(failed))
    }

    /// Resumes `job`; whether a pause was in force; see [`crate::store::Store::resume`].
    async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        let job = job.to_string();
        let read = self.sql(
            "SELECT COUNT(*) FROM {paused} WHERE job = ? AND (until_ms IS NULL OR until_ms > {now_ms})",
        );
        let delete = self.sql("DELETE FROM {paused} WHERE job = ?");
        self.transaction(self.budget() * 2, move |connection| {
            let (job, read, delete) = (job.clone(), read.clone(), delete.clone());
            Box::pin(async move {
                let (count,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(read))
                    .bind(&job)
                    .fetch_one(&mut *connection)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(delete))
                    .bind(&job)
                    .execute(&mut *connection)
                    .await?;
                Ok(count > 0)
            })
        })
        .await
        .map_err(|failed| self.failure(failed))
    }

    /// The pause of each of `jobs`, in order: every pause in force is read (the table holds only paused
    /// jobs) and looked up; see [`crate::store::Store::pauses`].
    async fn pauses(&self, jobs: &[String]) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        let select = self.sql(
            "SELECT job, CASE WHEN OCTET_LENGTH(value) <= ? THEN value END FROM {paused}
             WHERE until_ms IS NULL OR until_ms > {now_ms}",
        );
        let rows: Vec<(String, Option<String>)> = self
            .with_reader(self.budget() * 2, move |connection| {
                Box::pin(async move {
                    sqlx::query_as(sqlx::AssertSqlSafe(select))
                        .bind(MAX_VALUE)
                        .fetch_all(connection)
                        .await
                })
            })
            .await
            .map_err(|failed| self.failure(failed))?;
        let found: std::collections::HashMap<String, Option<String>> = rows.into_iter().collect();
        let value = jobs
            .iter()
            .map(|job| {
                found.get(job).map(|value| PauseRead {
                    // A value too long to read is still a pause: in force, by someone unknown.
                    pause: Pause::from_value(value.as_deref().unwrap_or("")),
                    nodes: 1,
                })
            })
            .collect();
        Ok(Read {
            value,
            missing: Vec::new(),
            skipped: Vec::new(),
        })
    }
}
