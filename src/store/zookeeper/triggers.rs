//! Trigger requests on ZooKeeper: one persistent node per request, `/triggers/<id>`, holding its JSON.
//!
//! The request node is also the *anchor* of the request's claims: a claim of `Trigger(<id>)` checks its
//! version in the claim's multi (`claim.rs`), so it is granted only while the node exists, and the winner
//! deletes it ([`ZookeeperStore::forget_trigger`]). ZooKeeper has no expiring nodes by default (TTL nodes
//! need a server flag), so a request past its window plus [`crate::trigger::KEEP_AFTER_WINDOW`] (on the
//! reader's clock) is deleted by the next read of the requests instead.

use zookeeper_client::CreateMode;

use super::{node_name, text, ZookeeperStore, EXCHANGE_TIMEOUT, MAX_CHILDREN};
use crate::lock::QuorumFailure;
use crate::store::{skip_note, Read, Triggers};
use crate::trigger::{self, TriggerRequest};

/// The node of request `id`.
pub(super) fn request_path(id: &str) -> String {
    format!("/triggers/{}", node_name(id))
}

impl Triggers for ZookeeperStore {
    /// Writes `request` (replacing one of the same id); see [`crate::store::Store::request_trigger`].
    async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        let path = request_path(&request.id);
        let json = request.to_json();
        let run = async {
            let session = self.sessions.current(EXCHANGE_TIMEOUT).await?;
            let options = CreateMode::Persistent.with_acls(session.acls);
            match session
                .client
                .create(&path, json.as_bytes(), &options)
                .await
            {
                Ok(_) => Ok(()),
                Err(zookeeper_client::Error::NodeExists) => session
                    .client
                    .set_data(&path, json.as_bytes(), None)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        };
        match tokio::time::timeout(EXCHANGE_TIMEOUT, run).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(self.failure(why)),
            Err(_) => Err(self.failure("no answer in time")),
        }
    }

    /// Every request kept, oldest first, those past their keep deleted on the way; see
    /// [`crate::store::Store::triggers`].
    async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        let session = self
            .sessions
            .current(EXCHANGE_TIMEOUT)
            .await
            .map_err(|why| self.failure(why))?;
        let mut ids = self
            .children(&session, "/triggers")
            .await
            .map_err(|why| self.failure(why))?;
        let mut skipped = Vec::new();
        if ids.len() > MAX_CHILDREN {
            skipped.push(format!(
                "zookeeper: {} trigger requests, only the first {MAX_CHILDREN} read",
                ids.len()
            ));
            ids.truncate(MAX_CHILDREN);
        }
        let datas = self
            .read_many(
                &session,
                ids.iter().map(|id| format!("/triggers/{id}")),
                super::records::READ_CHUNK,
            )
            .await
            .map_err(|why| self.failure(why))?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut requests = Vec::new();
        for (id, data) in ids.iter().zip(datas) {
            let Some((data, _)) = data else { continue };
            let parsed = text(&data)
                .and_then(|json| TriggerRequest::read(id, json).map_err(|e| e.to_string()));
            match parsed {
                Ok(request) if request.expires_at_ms() <= now_ms => {
                    self.forget_trigger(&request.id)
                }
                Ok(request) => requests.push(request),
                Err(why) => skipped.push(skip_note("zookeeper", "trigger request", id, &why)),
            }
        }
        Ok(Read {
            value: trigger::merge([requests]),
            missing: Vec::new(),
            skipped,
        })
    }

    /// Deletes the request in the background (a delete that fails leaves it to the next reads); see
    /// [`crate::store::Store::forget_trigger`].
    fn forget_trigger(&self, id: &str) {
        let Some(session) = self.sessions.ready() else {
            return;
        };
        let path = request_path(id);
        tokio::spawn(async move {
            let delete = session.client.delete(&path, None);
            let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, delete).await;
        });
    }
}
