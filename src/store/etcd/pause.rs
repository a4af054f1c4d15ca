//! Pauses on etcd: the job's `…:{<job>}:paused` key, written by `redcron pause` and deleted by
//! `redcron resume`, read by every claim of the job in its snapshot and compared in its transaction
//! (`snapshot.rs`), and read by `redcron status`.
//!
//! A pause with an end (`--for`) is bound to an etcd lease of that duration, so etcd deletes it by itself
//! when the lease expires, measured by etcd rather than by any host's wall clock; a pause without end is
//! a plain key. A new pause replaces the old one (and its lease binding), unless the old one outlasts it
//! ([`crate::lock::Pause::decide`]). Pause and resume are guarded writes (`pause_guard.rs`): a copy of
//! one that reaches etcd late, after another applied, changes nothing.

use etcd_client::{Txn, TxnOp, TxnOpResponse};

use super::history::{EXCHANGE_TIMEOUT, MAX_TXN_OPS};
use super::pause_guard::Change;
use super::EtcdStore;
use crate::lock::keys::pause_key;
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead, QuorumFailure};
use crate::store::Pauses;
use crate::store::Read;

impl Pauses for EtcdStore {
    /// Writes the pause, bound to an etcd lease of its duration if it has one, in a transaction that a
    /// stale copy cannot apply and that applies only on the pause it was decided on (`pause_guard.rs`);
    /// see [`crate::store::Store::pause`].
    async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        self.pause_guarded(job, pause, in_force).await
    }

    /// Deletes the pause, in a transaction that a stale copy cannot apply (`pause_guard.rs`); whether
    /// there was one when it applied; see [`crate::store::Store::resume`].
    async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        self.write_guarded(job, &Change::Resume).await
    }

    /// The pause of each of `jobs`, in order, read in read-only transactions; see
    /// [`crate::store::Store::pauses`]. A pause stands on every member: it is in the cluster's committed
    /// state, which each member applies.
    async fn pauses(&self, jobs: &[String]) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        let mut value = Vec::with_capacity(jobs.len());
        for chunk in jobs.chunks(MAX_TXN_OPS) {
            let gets: Vec<TxnOp> = chunk
                .iter()
                .map(|job| TxnOp::get(pause_key(&self.settings.key_prefix, job), None))
                .collect();
            let txn = Txn::new().and_then(gets);
            let answer = self
                .txn(EXCHANGE_TIMEOUT, txn)
                .await
                .map_err(|why| self.failure(why))?;
            for response in answer.op_responses() {
                let found = match response {
                    TxnOpResponse::Get(get) => get
                        .kvs()
                        .first()
                        .map(|kv| Pause::from_value(&String::from_utf8_lossy(kv.value()))),
                    _ => None,
                };
                value.push(found.map(|pause| PauseRead {
                    pause,
                    nodes: self.endpoints.len(),
                }));
            }
        }
        Ok(Read {
            value,
            missing: Vec::new(),
            skipped: Vec::new(),
        })
    }
}
