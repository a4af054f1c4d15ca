//! Pauses on the embedded store: one row per paused job in `paused`, with the wall-clock instant it ends
//! (`NULL`: until resumed), read by every claim in its transaction ([`Shared::pause_of`]), as the Lua
//! scripts read the `…:paused` key. A pause is written in the transaction that reads the pause in force,
//! so a shorter one never replaces a longer one by accident ([`Pause::decide`]).

use rusqlite::{params, OptionalExtension as _, Transaction};

use super::{now_ms, EmbeddedStore, Shared};
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead, QuorumFailure};
use crate::store::Pauses;
use crate::store::Read;

impl Pauses for EmbeddedStore {
    /// Pauses `job` until `pause.until` (or until resumed), unless a pause in force outlasts it (with
    /// [`InForce::KeepLonger`]) or it has ended: decided and written in one transaction; see
    /// [`crate::store::Store::pause`].
    async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        let (job, pause) = (job.to_string(), pause.clone());
        self.write(move |shared, transaction| {
            let current = shared.pause_of(transaction, &job)?;
            let outcome = pause.decide(current.as_ref(), in_force, chrono::Utc::now());
            if outcome == PauseOutcome::Paused {
                let until = pause.until.map(|until| until.timestamp_millis());
                transaction.execute(
                    "INSERT OR REPLACE INTO paused (job, value, until_ms) VALUES (?1, ?2, ?3)",
                    params![job, pause.to_value(), until],
                )?;
            }
            Ok(outcome)
        })
        .await
    }

    /// Resumes `job`; whether it was paused; see [`crate::store::Store::resume`].
    async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        let job = job.to_string();
        self.write(move |shared, transaction| {
            let was = shared.pause_of(transaction, &job)?.is_some();
            transaction.execute("DELETE FROM paused WHERE job = ?1", [&job])?;
            Ok(was)
        })
        .await
    }

    /// The pause of each of `jobs`, in order; see [`crate::store::Store::pauses`].
    async fn pauses(&self, jobs: &[String]) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        let jobs = jobs.to_vec();
        self.read(move |shared, connection| {
            // A read: a deferred transaction on a read connection, which never waits for the writer.
            let transaction = connection.transaction()?;
            let transaction = &transaction;
            let value = jobs
                .iter()
                .map(|job| {
                    let pause = shared.pause_of(transaction, job)?;
                    Ok(pause.map(|pause| PauseRead { pause, nodes: 1 }))
                })
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Read {
                value,
                missing: Vec::new(),
                skipped: Vec::new(),
            })
        })
        .await
    }
}

impl Shared {
    /// The pause of `job`, unless it has ended.
    pub(super) fn pause_of(
        &self,
        transaction: &Transaction,
        job: &str,
    ) -> rusqlite::Result<Option<Pause>> {
        let value: Option<String> = transaction
            .prepare_cached(
                "SELECT value FROM paused WHERE job = ?1 AND (until_ms IS NULL OR until_ms > ?2)",
            )?
            .query_row(params![job, now_ms()], |row| row.get(0))
            .optional()?;
        Ok(value.as_deref().map(Pause::from_value))
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use tempfile::TempDir;

    use super::super::EmbeddedStore;
    use crate::history::HistorySettings;
    use crate::lock::{
        ClaimOutcome, ClaimRequest, InForce, LockSettings, Overlap, Pause, PauseOutcome,
    };
    use crate::schedule::Tick;
    use crate::store::{Claims, Pauses};

    fn open(dir: &TempDir) -> EmbeddedStore {
        let path = dir.path().join("redcron.db");
        EmbeddedStore::open(&path, LockSettings::default(), HistorySettings::default())
            .expect("the store opens")
    }

    async fn claim(store: &EmbeddedStore, tick: i64) -> ClaimOutcome {
        let request = ClaimRequest::new("w", "job", Tick(tick), Overlap::Allow, "f");
        store.claim_many(&[request]).await.remove(0)
    }

    fn pause(for_ms: Option<i64>) -> Pause {
        Pause {
            until: for_ms.map(|ms| Utc::now() + chrono::Duration::milliseconds(ms)),
            by: "ops@host".to_string(),
            reason: "migration".to_string(),
        }
    }

    async fn paused(store: &EmbeddedStore, pause: Pause) {
        let outcome = store.pause("job", &pause, InForce::KeepLonger).await;
        assert_eq!(outcome.expect("written"), PauseOutcome::Paused);
    }

    /// A pause survives a reopen of the file (the suite's `conformance::embedded` proves the rest of
    /// pause and resume on one open store).
    #[tokio::test]
    async fn a_paused_job_is_refused_until_resumed_and_a_reopen_keeps_the_pause() {
        let dir = TempDir::new().expect("a temporary directory");
        let store = open(&dir);
        paused(&store, pause(None)).await;
        match claim(&store, 1_000).await {
            ClaimOutcome::Paused(found) => assert_eq!(found.reason, "migration"),
            other => panic!("expected Paused, got {other:?}"),
        }
        let reopened = open(&dir);
        assert!(matches!(
            claim(&reopened, 2_000).await,
            ClaimOutcome::Paused(_)
        ));
        let read = reopened
            .pauses(&["job".into(), "other".into()])
            .await
            .expect("read");
        assert_eq!(read.value[0].as_ref().map(|r| r.nodes), Some(1));
        assert_eq!(read.value[1], None);
        assert!(reopened.resume("job").await.expect("resumed"));
        assert!(!reopened.resume("job").await.expect("resumed again"));
        // The ticks refused while paused were never claimed: the first of them is still free.
        assert!(matches!(
            claim(&reopened, 1_000).await,
            ClaimOutcome::Won(_)
        ));
    }

    /// A database written by the previous version (schema 1) is upgraded in place, its claims kept.
    #[tokio::test]
    async fn a_schema_1_file_is_upgraded_and_keeps_its_claims() {
        let dir = TempDir::new().expect("a temporary directory");
        let path = dir.path().join("redcron.db");
        {
            let connection = rusqlite::Connection::open(&path).expect("a database");
            connection
                .execute_batch(super::super::SCHEMA)
                .expect("schema 1");
            connection
                .execute_batch(
                    "INSERT INTO claims (key, tick, value) VALUES ('redcron:{job}:claim', 5000, 'old/1|1|5000|f');
                     PRAGMA user_version = 1;",
                )
                .expect("a claim of schema 1");
        }
        let store = open(&dir);
        assert!(matches!(
            claim(&store, 5_000).await,
            ClaimOutcome::AlreadyClaimed { .. }
        ));
        paused(&store, pause(None)).await;
    }
}
