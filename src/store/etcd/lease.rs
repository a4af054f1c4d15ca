//! Renewals and releases on etcd: a granted lease is an etcd lease with the lock's TTL, to which the claim
//! bound the job's lease key (and nothing else).
//!
//! A renewal is one keep-alive: the leader restarts the etcd lease's TTL and answers with it, or answers
//! TTL 0 once the lease expired or was revoked — then the key is gone, and the lease is lost for good, as
//! etcd decided. The worker's deadline moves to `renew start + ttl − drift` only if the answer came
//! before the old deadline and the leader that restarted the TTL was the cluster's leader when it did:
//! then the TTL restarted after the renewal started, so the deadline ends before etcd's expiry (under the
//! bounded drift rate), as on Redis. A release revokes the etcd lease, which deletes exactly the keys
//! bound to it: this attempt's lease key, never another holder's. The claim record stays.
//!
//! **Why a keep-alive alone proves nothing.** Keep-alives do not go through raft: the member that leads
//! (or the one a follower forwards to) restarts the TTL in its own memory. A leader that was hung
//! (SIGSTOP, a long GC or fsync stall) past an election timeout still believes it leads when it resumes,
//! and answers the keep-alives queued while it was hung — TTL restarted — before it hears of the new
//! leader, whose own timer for the lease never restarted (seen on Debian's etcd 3.4.23: an answer
//! "TTL 3" from the resumed old leader, and the lease expired on the new one 2 s later; later etcd
//! releases check their leadership before renewing, see etcd issue 15247). Believing that answer let a job outlive its
//! lease by up to the time the old leader was hung. So a renewal is
//! three requests to one member ([`EtcdStore::keep_alive_on_leader`]): a read of the lease key, the
//! keep-alive, and a linearizable read of the lease key; it counts only if both reads report the same
//! raft term. Terms in answers only grow on a member, so the member was in that term when the keep-alive
//! reached it, and the TTL was restarted by that term's leader (the member itself, or the one it
//! forwarded to); the linearizable read was confirmed, after the keep-alive, by a leader of that term or
//! an earlier one, so no leader of a later term existed yet: every later leader promotes the lease with a
//! full TTL from its election on. The second read also finds the lease key still bound to the etcd lease
//! (or the lease not held). A renewal across a change of leader is unconfirmed, and retried.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use std::future::Future;

use etcd_client::{EventType, GetOptions, WatchOptions};

use super::cluster::Cluster;
use super::EtcdStore;
use crate::clock::boot::BootInstant;
use crate::lock::keys::claim_keys;
use crate::lock::{validity, Lease, RenewError};
use crate::store::Leases;

impl EtcdStore {
    /// One keep-alive of etcd lease `id`, bound to `key`, believed only if the cluster's leader restarted
    /// its TTL (see the module's doc): a serializable read of `key`, the keep-alive and a linearizable read
    /// of `key`, all on one member, within `node_timeout` as the pace stretches it but at most `cap`.
    /// `Ok(true)`: renewed by the leader; `Ok(false)`: the lease is gone (etcd answered TTL 0, or `key` is
    /// no longer bound to it); `Err`: unconfirmed.
    async fn keep_alive_on_leader(
        &self,
        id: i64,
        key: &str,
        cap: Duration,
    ) -> Result<bool, String> {
        let limit = self.settings.node_timeout;
        let answer = self
            .cluster
            .call_renewal(limit, cap, |mut client| {
                let key = key.to_owned();
                async move {
                    let local = Some(GetOptions::new().with_serializable().with_keys_only());
                    let before = client.get(key.as_str(), local).await?;
                    match client.lease_keep_alive(id).await {
                        Ok(_) => {}
                        Err(etcd_client::Error::LeaseKeepAliveError(why))
                            if why == "lease not found" =>
                        {
                            return Ok(Renewed::Gone)
                        }
                        Err(other) => return Err(other),
                    }
                    let after = client
                        .get(key, Some(GetOptions::new().with_keys_only()))
                        .await?;
                    let term =
                        |answer: &etcd_client::GetResponse| answer.header().map(|h| h.raft_term());
                    let (was, is) = (term(&before), term(&after));
                    if was.is_none() || was != is {
                        return Ok(Renewed::LeaderChanged { was, is });
                    }
                    let bound = after.kvs().first().is_some_and(|kv| kv.lease() == id);
                    Ok(if bound {
                        Renewed::ByLeader
                    } else {
                        Renewed::Gone
                    })
                }
            })
            .await?;
        match answer {
            Renewed::ByLeader => Ok(true),
            Renewed::Gone => Ok(false),
            Renewed::LeaderChanged { was, is } => Err(format!(
                "the leader changed during the renewal (raft term {} then {}): the keep-alive may have \
                 been answered by a deposed leader",
                was.map_or("unknown".to_string(), |t| t.to_string()),
                is.map_or("unknown".to_string(), |t| t.to_string()),
            )),
        }
    }

    /// Whether `key` is bound to etcd lease `id` now (a linearizable read); `None` if no member answered.
    async fn bound_now(&self, key: &str, id: i64) -> Option<bool> {
        let read = self
            .cluster
            .call(self.settings.node_timeout, |mut client| {
                let key = key.to_owned();
                async move {
                    client
                        .get(key, Some(GetOptions::new().with_keys_only()))
                        .await
                }
            })
            .await
            .ok()?;
        Some(read.kvs().first().is_some_and(|kv| kv.lease() == id))
    }

    /// Whether this process released the lease of `value` and etcd has not applied the revoke yet.
    pub(super) fn was_released(&self, value: &str) -> bool {
        lock(&self.released).contains(value)
    }

    /// The key a granted lease holds: the job's lease key (per tick with `overlap: allow`).
    fn lease_key(&self, lease: &Lease) -> String {
        let [key, ..] = claim_keys(
            &self.settings.key_prefix,
            &lease.job,
            lease.tick,
            lease.overlap,
            &lease.series,
        );
        key
    }

    /// Remembers the etcd lease of a granted lease, by its value.
    pub(super) fn remember(&self, value: &str, id: i64, revision: i64) {
        self.lock_leases()
            .insert(value.to_string(), super::Held { id, revision });
    }

    /// The etcd lease of a granted lease.
    fn etcd_lease(&self, value: &str) -> Option<i64> {
        self.lock_leases().get(value).map(|granted| granted.id)
    }

    /// The revision of a granted lease's write.
    fn written_at(&self, value: &str) -> Option<i64> {
        self.lock_leases()
            .get(value)
            .map(|granted| granted.revision)
    }

    /// Forgets a lease that is released or lost; returns its etcd lease.
    fn forget(&self, value: &str) -> Option<i64> {
        self.lock_leases().remove(value).map(|granted| granted.id)
    }

    fn lock_leases(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, super::Held>> {
        // A panic while holding the map leaves it whole (every use is one call on it).
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Leases for EtcdStore {
    /// Extends the lease by a full TTL if etcd still holds it, before its deadline; see
    /// [`crate::store::Store::renew`].
    async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        let start = lease.start_renewal()?;
        let Some(id) = self.etcd_lease(&lease.value) else {
            lease.mark_lost();
            let failure = self.failure("no etcd lease known for this lease".to_string());
            return Err(RenewError::NotHeld(failure));
        };
        // A renewal confirmed after the deadline proves nothing about the time in between.
        let cap = lease.deadline().saturating_duration_since(start);
        let key = self.lease_key(lease);
        let answer = self.keep_alive_on_leader(id, &key, cap).await;
        let expired = BootInstant::now() >= lease.deadline();
        match (answer, expired) {
            (Ok(false), _) => {
                lease.mark_lost();
                let why = "lease not held: etcd expired or revoked it".to_string();
                Err(RenewError::NotHeld(self.failure(why)))
            }
            (_, true) => {
                lease.mark_lost();
                Err(RenewError::Expired)
            }
            (Ok(true), false) => {
                let ttl = self.settings.ttl;
                let drift = validity::drift(ttl, self.settings.drift_factor);
                lease.extend_to(start + ttl.saturating_sub(drift));
                Ok(())
            }
            (Err(why), false) => Err(RenewError::Unconfirmed(self.failure(why))),
        }
    }

    /// Resolves once etcd no longer holds `lease`: its lease key deleted (the etcd lease expired or was
    /// revoked) or bound to another etcd lease; at once if this store does not know the lease (released).
    ///
    /// A watch of the lease key from the claim's revision on, opened again (from the last event seen) on
    /// another member when its stream ends. It tells the watchdog the moment etcd took the lease away,
    /// which a renewal would learn only at its next turn: an etcd 3.4 leader that stalled past a lease's
    /// TTL may, when it resumes, revoke the leases that its successor kept alive (etcd issue 15247; by
    /// hand, one stall in four) — the job must
    /// then stop at once, before its next write, since the next tick may be granted to another worker.
    fn lease_gone<'a>(&'a self, lease: &Lease) -> impl Future<Output = ()> + Send + use<'a> {
        let id = self.etcd_lease(&lease.value);
        let key = self.lease_key(lease);
        // Every change of the key since the claim's write comes after its revision.
        let mut from = self
            .written_at(&lease.value)
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        async move {
            let Some(id) = id else { return };
            loop {
                let opened = self
                    .cluster
                    .call(self.settings.node_timeout, |mut client| {
                        let key = key.clone();
                        let options = WatchOptions::new().with_start_revision(from);
                        async move { client.watch(key, Some(options)).await }
                    })
                    .await;
                if let Ok(mut stream) = opened {
                    while let Ok(Some(answer)) = stream.message().await {
                        if answer.canceled() || answer.compact_revision() > 0 {
                            // Compacted past `from` (or cancelled): a read says whether it still holds.
                            match self.bound_now(&key, id).await {
                                Some(false) => return,
                                Some(true) | None => break,
                            }
                        }
                        for event in answer.events() {
                            let held = event.event_type() == EventType::Put
                                && event.kv().is_some_and(|kv| kv.lease() == id);
                            if !held {
                                return;
                            }
                            if let Some(kv) = event.kv() {
                                from = kv.mod_revision().saturating_add(1);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// At once, as [`Leases::release`]: there is nothing to gather a release with here.
    async fn release_soon(&self, lease: &Lease) {
        Leases::release(self, lease).await
    }

    /// Revokes the lease's etcd lease (deleting its lease key), also after the lease was lost (the worker
    /// releases every lease it won); the claim record stays. Returns once etcd answered, or after
    /// `node_timeout`; a revoke fails over from a member that is down or hung to one that serves, and one
    /// that failed even so (an election) is tried again in the background until etcd answers, bounded by
    /// the TTL (after which etcd has expired the lease anyway).
    async fn release(&self, lease: &Lease) {
        let Some(id) = self.forget(&lease.value) else {
            return;
        };
        let released = Arc::clone(&self.released);
        lock(&released).insert(lease.value.clone());
        let (value, cluster) = (lease.value.clone(), Arc::clone(&self.cluster));
        let (per_try, bound) = (self.settings.node_timeout, self.settings.ttl);
        let revoke = tokio::spawn(async move {
            revoke(cluster, id, per_try, bound).await;
            lock(&released).remove(&value);
        });
        let _ = tokio::time::timeout(self.settings.node_timeout, revoke).await;
    }
}

/// What one confirmed keep-alive found.
enum Renewed {
    /// The leader of the term the member was in restarted the TTL, and the key is still bound to the lease.
    ByLeader,
    /// etcd answered TTL 0, or the key is gone or bound to another lease: the lease is not held.
    Gone,
    /// The member's raft term changed between the reads: whoever restarted the TTL may have been deposed.
    LeaderChanged { was: Option<u64>, is: Option<u64> },
}

/// The set of released values; a panic while holding it leaves it whole (every use is one call on it).
fn lock(released: &Mutex<HashSet<String>>) -> MutexGuard<'_, HashSet<String>> {
    released
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Revokes etcd lease `id` until a member answers (done, or the lease is already gone), each try on a
/// member that serves (failing over from one that is down or hung within `per_try`), for at most `bound`.
pub(super) async fn revoke(cluster: Arc<Cluster>, id: i64, per_try: Duration, bound: Duration) {
    let retries = async {
        loop {
            let revoked = cluster
                .call(per_try, |mut client| async move {
                    match client.lease_revoke(id).await {
                        Err(etcd_client::Error::GRpcStatus(status))
                            if status.message().contains("lease not found") =>
                        {
                            Ok(())
                        }
                        other => other.map(|_| ()),
                    }
                })
                .await;
            if revoked.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let _ = tokio::time::timeout(bound, retries).await;
}
