//! The embedded store: the same leases, claims and tokens in process memory, for a single host with no
//! Redis configured.
//!
//! One process is one node and one majority, so every guarantee of the Redis store holds within the
//! process: a tick is claimed for good (until the process exits), tokens strictly increase, a lease expires
//! after its TTL unless renewed, and a lost lease is never renewed. Nothing survives a restart of the
//! process — which is why the tokens' floor comes from the tick ([`super::redis::token_floor`]): a restarted
//! worker still hands out tokens above those of earlier ticks.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

use super::redis::{claim_keys, lease_key, token_floor};
use super::{validity, ClaimOutcome, ClaimRequest, Lease, LockSettings, QuorumFailure, RenewError};

/// Leases, claims and tokens in process memory.
pub struct MemoryStore {
    settings: LockSettings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per job: the highest token and the highest claimed tick (ms).
    fences: HashMap<String, u64>,
    claims: HashMap<String, i64>,
    /// Per lease key: the holder's value and when it expires.
    leases: HashMap<String, (String, Instant)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new(settings: LockSettings) -> MemoryStore {
        MemoryStore {
            settings,
            state: Mutex::new(State::default()),
        }
    }

    /// The lock settings this store was built with.
    pub fn settings(&self) -> &LockSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the maps half-updated in a way that matters (each
        // update is a single insert), so a poisoned lock is used as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims every request; see [`super::LockStore::claim_many`].
    pub fn claim_many(&self, worker_id: &str, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        let mut state = self.lock();
        let now = Instant::now();
        let ttl = self.settings.ttl;
        let drift = validity::drift(ttl, self.settings.drift_factor);
        requests
            .iter()
            .map(|request| {
                let [lease_key, fence_key, claim_key] = claim_keys(
                    &self.settings.key_prefix,
                    &request.job,
                    request.tick,
                    request.overlap,
                );
                if state
                    .claims
                    .get(&claim_key)
                    .is_some_and(|&claimed| claimed >= request.tick.as_millis())
                {
                    return ClaimOutcome::AlreadyClaimed;
                }
                if let Some((holder, expires)) = state.leases.get(&lease_key) {
                    if *expires > now {
                        let worker = holder
                            .rsplit_once('/')
                            .map_or(holder.as_str(), |(worker, _)| worker);
                        return ClaimOutcome::Busy {
                            holder: Some(worker.to_string()),
                            ttl: Some(*expires - now),
                        };
                    }
                }
                let fence = state.fences.get(&fence_key).copied().unwrap_or(0);
                let token = fence.saturating_add(1).max(token_floor(request.tick));
                let value = format!("{worker_id}/{}", uuid::Uuid::new_v4());
                state.fences.insert(fence_key, token);
                state.claims.insert(claim_key, request.tick.as_millis());
                state.leases.insert(lease_key, (value.clone(), now + ttl));
                ClaimOutcome::Won(Lease::new(
                    request,
                    token,
                    value,
                    now + ttl.saturating_sub(drift),
                ))
            })
            .collect()
    }

    /// Extends the lease if it is still held and its deadline has not passed.
    pub fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        if lease.is_lost() {
            return Err(RenewError::AlreadyLost);
        }
        let now = Instant::now();
        if now >= lease.deadline() {
            lease.mark_lost();
            return Err(RenewError::Expired);
        }
        let key = lease_key(&self.settings.key_prefix, lease);
        let mut state = self.lock();
        match state.leases.get_mut(&key) {
            Some((value, expires)) if *value == lease.value && *expires > now => {
                let ttl = self.settings.ttl;
                *expires = now + ttl;
                lease.extend_to(
                    now + ttl.saturating_sub(validity::drift(ttl, self.settings.drift_factor)),
                );
                Ok(())
            }
            _ => {
                lease.mark_lost();
                Err(RenewError::NotHeld(QuorumFailure {
                    configured: 1,
                    needed: 1,
                    granted: 0,
                    failures: vec![("memory".to_string(), "lease not held".to_string())],
                }))
            }
        }
    }

    /// Removes the lease if it is still this lease's value.
    pub fn release(&self, lease: &Lease) {
        let key = lease_key(&self.settings.key_prefix, lease);
        let mut state = self.lock();
        if state
            .leases
            .get(&key)
            .is_some_and(|(value, _)| *value == lease.value)
        {
            state.leases.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lock::Overlap;
    use crate::schedule::Tick;

    fn store(ttl_ms: u64) -> MemoryStore {
        let settings = LockSettings {
            ttl: Duration::from_millis(ttl_ms),
            ..LockSettings::default()
        };
        MemoryStore::new(settings)
    }

    fn request(tick: i64) -> ClaimRequest {
        ClaimRequest {
            job: "job".into(),
            tick: Tick(tick),
            overlap: Overlap::Skip,
        }
    }

    fn won(outcome: ClaimOutcome) -> Lease {
        match outcome {
            ClaimOutcome::Won(lease) => lease,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn claims_once_and_tokens_increase() {
        let store = store(1000);
        let first = won(store.claim_many("a", &[request(1_000)]).remove(0));
        assert!(matches!(
            store.claim_many("b", &[request(1_000)]).remove(0),
            ClaimOutcome::AlreadyClaimed
        ));
        assert!(matches!(
            store.claim_many("b", &[request(2_000)]).remove(0),
            ClaimOutcome::Busy { .. }
        ));
        store.release(&first);
        assert!(matches!(
            store.claim_many("b", &[request(1_000)]).remove(0),
            ClaimOutcome::AlreadyClaimed
        ));
        let second = won(store.claim_many("b", &[request(2_000)]).remove(0));
        assert!(second.token > first.token);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_lease_is_lost_for_good_and_release_spares_the_next_holder() {
        let store = store(100);
        let mut a = won(store.claim_many("a", &[request(1_000)]).remove(0));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let b = won(store.claim_many("b", &[request(2_000)]).remove(0));
        assert!(b.token > a.token);
        assert_eq!(store.renew(&mut a), Err(RenewError::Expired));
        assert_eq!(store.renew(&mut a), Err(RenewError::AlreadyLost));
        store.release(&a);
        assert!(matches!(
            store.claim_many("c", &[request(3_000)]).remove(0),
            ClaimOutcome::Busy { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_keeps_a_lease_past_its_ttl() {
        let store = store(100);
        let mut a = won(store.claim_many("a", &[request(1_000)]).remove(0));
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            store.renew(&mut a).expect("renewal within the validity");
        }
        assert!(a.is_valid());
        assert!(matches!(
            store.claim_many("b", &[request(2_000)]).remove(0),
            ClaimOutcome::Busy { .. }
        ));
    }
}
