//! Trigger requests on etcd: one key per request, `<prefix>:triggers/<id>`, holding its JSON and bound to
//! an etcd lease of its window plus [`crate::trigger::KEEP_AFTER_WINDOW`], so etcd drops it by itself.
//!
//! The request key is also the *anchor* of the request's claims: a claim of `Trigger(<id>)` is granted
//! only while the key exists (`snapshot.rs`), and the winner deletes it ([`EtcdStore::forget_trigger`]).
//! Its claim record is bound to a longer etcd lease granted later, so while the request key exists any
//! record of it does too, and once the key is gone no claim of it is granted: one run per request, ever,
//! with no clock (`docs/protocol.md`, *The etcd store*).

use etcd_client::{GetOptions, PutOptions};

use super::history::EXCHANGE_TIMEOUT;
use super::EtcdStore;
use crate::lock::QuorumFailure;
use crate::store::Triggers;
use crate::store::{skip_note, Read};
use crate::trigger::{self, TriggerRequest, KEEP_AFTER_WINDOW};

/// The key of request `id` under `prefix`.
pub(super) fn request_key(prefix: &str, id: &str) -> String {
    format!("{}{id}", requests_prefix(prefix))
}

/// The prefix of every request key.
fn requests_prefix(prefix: &str) -> String {
    format!("{prefix}:triggers/")
}

impl Triggers for EtcdStore {
    /// Writes `request`, kept for its window plus [`KEEP_AFTER_WINDOW`] (a duration from the request
    /// itself: no clock is read); see [`crate::store::Store::request_trigger`].
    async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        let window = (request.not_after - request.requested_at)
            .to_std()
            .unwrap_or_default();
        let id = self
            .grant_lease(window + KEEP_AFTER_WINDOW)
            .await
            .map_err(|why| self.failure(why))?;
        let key = request_key(&self.settings.key_prefix, &request.id);
        let json = request.to_json();
        let options = Some(PutOptions::new().with_lease(id));
        self.put(EXCHANGE_TIMEOUT, key, json, options)
            .await
            .map(|_| ())
            .map_err(|why| self.failure(why))
    }

    /// Every request etcd keeps, oldest first; see [`crate::store::Store::triggers`].
    async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        let prefix = requests_prefix(&self.settings.key_prefix);
        let answer = self
            .get(
                EXCHANGE_TIMEOUT,
                prefix.clone(),
                GetOptions::new().with_prefix(),
            )
            .await
            .map_err(|why| self.failure(why))?;
        let (mut requests, mut skipped) = (Vec::new(), Vec::new());
        for kv in answer.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let id = key.strip_prefix(prefix.as_str()).unwrap_or(&key);
            let parsed = std::str::from_utf8(kv.value())
                .map_err(|_| "not UTF-8 text".to_string())
                .and_then(|json| TriggerRequest::read(id, json).map_err(|e| e.to_string()));
            match parsed {
                Ok(request) => requests.push(request),
                Err(why) => skipped.push(skip_note("etcd", "trigger request", &key, &why)),
            }
        }
        Ok(Read {
            value: trigger::merge([requests]),
            missing: Vec::new(),
            skipped,
        })
    }

    /// Deletes the request in the background (a delete that fails leaves it to expire); see
    /// [`crate::store::Store::forget_trigger`].
    fn forget_trigger(&self, id: &str) {
        let cluster = std::sync::Arc::clone(&self.cluster);
        let key = request_key(&self.settings.key_prefix, id);
        tokio::spawn(async move {
            let delete = |mut c: etcd_client::Client| {
                let key = key.clone();
                async move { c.delete(key, None).await }
            };
            let _ = cluster.call(EXCHANGE_TIMEOUT, delete).await;
        });
    }
}
