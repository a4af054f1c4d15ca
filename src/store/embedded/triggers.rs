//! Trigger requests on the embedded store: one row per request in `triggers`, dropped at its expiry (this
//! host's wall clock) by every write and skipped by every read, as on the Redis nodes.

use rusqlite::params;
use rusqlite::types::ValueRef;

use super::{now_ms, EmbeddedStore};
use crate::lock::QuorumFailure;
use crate::store::Triggers;
use crate::store::{skip_note, Read};
use crate::trigger::{self, TriggerRequest};

impl Triggers for EmbeddedStore {
    /// Keeps `request` until its expiry; see [`crate::store::Store::request_trigger`].
    async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        let request = request.clone();
        self.write(move |_, transaction| {
            transaction
                .prepare_cached("DELETE FROM triggers WHERE expires_ms <= ?1")?
                .execute([now_ms()])?;
            transaction
                .prepare_cached(
                    "INSERT OR REPLACE INTO triggers (id, job, request, expires_ms) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![
                    request.id,
                    request.job,
                    request.to_json(),
                    request.expires_at_ms()
                ])?;
            Ok(())
        })
        .await
    }

    /// Every request not past its expiry, oldest first; see [`crate::store::Store::triggers`].
    async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        self.read(|shared, connection| {
            let mut select = connection
                .prepare_cached("SELECT id, request FROM triggers WHERE expires_ms > ?1")?;
            let mut rows = select.query([now_ms()])?;
            let (mut requests, mut skipped) = (Vec::new(), Vec::new());
            while let Some(row) = rows.next()? {
                // Read as bytes: a row written by something else may hold any type.
                let text = |index| -> rusqlite::Result<Option<String>> {
                    Ok(match row.get_ref(index)? {
                        ValueRef::Text(bytes) => String::from_utf8(bytes.to_vec()).ok(),
                        _ => None,
                    })
                };
                let id = text(0)?.unwrap_or_else(|| "(not text)".to_string());
                let read = match text(1)? {
                    Some(json) => TriggerRequest::read(&id, &json).map_err(|e| e.to_string()),
                    None => Err("not UTF-8 text".to_string()),
                };
                match read {
                    Ok(request) => requests.push(request),
                    Err(why) => {
                        skipped.push(skip_note(&shared.label(), "trigger request", &id, &why))
                    }
                }
            }
            Ok(Read {
                value: trigger::merge([requests]),
                missing: Vec::new(),
                skipped,
            })
        })
        .await
    }

    /// Deletes the request, in the background; see [`crate::store::Store::forget_trigger`].
    fn forget_trigger(&self, id: &str) {
        let (store, id) = (self.clone_handle(), id.to_string());
        tokio::spawn(async move {
            let _ = store
                .write(move |_, transaction| {
                    transaction.execute("DELETE FROM triggers WHERE id = ?1", [id])
                })
                .await;
        });
    }
}
