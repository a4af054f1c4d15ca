//! Trigger requests on the SQL store: one row per request in `triggers`, skipped by every read once its
//! expiry (on the database's clock) has passed, and swept by the announcements ([`super::records`]).

use super::records::MAX_VALUE;
use super::SqlStore;
use crate::lock::QuorumFailure;
use crate::store::{skip_note, Read, Triggers};
use crate::trigger::{self, TriggerRequest};

impl Triggers for SqlStore {
    /// Keeps `request` until its expiry; see [`crate::store::Store::request_trigger`].
    async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        let upsert =
            self.shared
                .dialect
                .upsert("triggers", &["id", "job", "request", "expires_ms"], 1);
        let request = request.clone();
        self.with_connection(self.budget() * 2, move |connection| {
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(upsert))
                    .bind(&request.id)
                    .bind(&request.job)
                    .bind(request.to_json())
                    .bind(request.expires_at_ms())
                    .execute(connection)
                    .await?;
                Ok(())
            })
        })
        .await
        .map_err(|failed| self.failure(failed))
    }

    /// Every request not past its expiry, oldest first; see [`crate::store::Store::triggers`].
    async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        let select = self.sql(
            "SELECT id, CASE WHEN OCTET_LENGTH(request) <= ? THEN request END FROM {triggers}
             WHERE expires_ms > {now_ms}",
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
        let (mut requests, mut skipped) = (Vec::new(), Vec::new());
        for (id, json) in rows {
            let read = match json {
                Some(json) => TriggerRequest::read(&id, &json).map_err(|e| e.to_string()),
                None => Err(format!("longer than {MAX_VALUE} bytes")),
            };
            match read {
                Ok(request) => requests.push(request),
                Err(why) => {
                    skipped.push(skip_note(&self.shared.target, "trigger request", &id, &why))
                }
            }
        }
        Ok(Read {
            value: trigger::merge([requests]),
            missing: Vec::new(),
            skipped,
        })
    }

    /// Deletes the request, in the background; see [`crate::store::Store::forget_trigger`].
    fn forget_trigger(&self, id: &str) {
        let (store, id) = (self.clone_handle(), id.to_string());
        let delete = self.sql("DELETE FROM {triggers} WHERE id = ?");
        tokio::spawn(async move {
            let _ = store
                .with_connection(store.budget() * 2, move |connection| {
                    Box::pin(async move {
                        sqlx::query(sqlx::AssertSqlSafe(delete))
                            .bind(id)
                            .execute(connection)
                            .await?;
                        Ok(())
                    })
                })
                .await;
        });
    }
}
