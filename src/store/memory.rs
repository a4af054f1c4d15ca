//! The embedded store: the same leases, claims and tokens in process memory, for a single host with no
//! Redis configured.
//!
//! One process is one node and one majority, so both rounds of a claim happen at once, under one mutex, with
//! the rules of the Lua scripts ([`crate::store::redis::scripts`]) and the names of [`crate::lock::keys`]: a tick is confirmed
//! for one claimant only, tokens strictly increase, a lease expires after its TTL on the boot clock unless
//! renewed, and a lost lease is never renewed. The answers are those a Redis cluster gives in the same
//! situation. Nothing survives a restart of the process — which is why the tokens' floor comes from the
//! tick ([`crate::lock::keys::token_floor`]): a restarted worker still hands out tokens above those of earlier
//! ticks.

use std::collections::{BTreeMap, HashMap};

use chrono::Utc;
use std::sync::Mutex;

use crate::clock::boot::BootInstant;
use crate::history::{self, Entry, HistorySettings, Query};
use crate::lock::keys::{attempt_value, claim_keys, claimant_of, lease_key, token_floor, Holder};
use crate::lock::{
    validity, ClaimOutcome, ClaimRequest, Lease, LockSettings, QuorumFailure, RenewError,
};
use crate::membership::{self, Member};
use crate::store::Read;

/// Leases, claims and tokens in process memory.
pub struct MemoryStore {
    settings: LockSettings,
    history: HistorySettings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per fence key: the highest token.
    fences: HashMap<String, u64>,
    /// Per claim key: the highest confirmed tick (ms) and the lease value that confirmed it.
    claims: HashMap<String, (i64, String)>,
    /// Per lease key: the holder's value and when it expires.
    leases: HashMap<String, (String, BootInstant)>,
    /// Per job, per tick: the entries by id.
    history: HashMap<String, BTreeMap<i64, HashMap<String, Entry>>>,
    /// Per worker: its last announcement, stamped, and when its heartbeat expires.
    members: HashMap<String, (Member, BootInstant)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new(settings: LockSettings) -> MemoryStore {
        MemoryStore {
            settings,
            history: HistorySettings::default(),
            state: Mutex::new(State::default()),
        }
    }

    /// The lock settings this store was built with.
    pub fn settings(&self) -> &LockSettings {
        &self.settings
    }

    /// The same store with `history` as its history bound.
    pub fn with_history(self, history: HistorySettings) -> MemoryStore {
        MemoryStore { history, ..self }
    }

    /// The history settings this store was built with.
    pub fn history_settings(&self) -> &HistorySettings {
        &self.history
    }

    /// Keeps `entries`, and the newest `keep_ticks` ticks of each job.
    pub fn record(&self, entries: &[Entry]) {
        let mut state = self.lock();
        for entry in entries {
            let ticks = state.history.entry(entry.job.clone()).or_default();
            ticks
                .entry(entry.tick)
                .or_default()
                .insert(entry.id(), entry.clone());
            while ticks.len() > self.history.keep_ticks {
                ticks.pop_first();
            }
        }
    }

    /// The entries of `query`, newest first.
    pub fn history(&self, query: &Query) -> Read<Vec<Entry>> {
        let state = self.lock();
        let (since, until) = (
            query.since.map_or(i64::MIN, |t| t.as_millis()),
            query.until.map_or(i64::MAX, |t| t.as_millis()),
        );
        let entries = state.history.get(&query.job).into_iter().flat_map(|ticks| {
            ticks
                .range(since..=until)
                .flat_map(|(_, entries)| entries.values().cloned())
        });
        let mut merged = history::merge([entries.collect::<Vec<_>>()]);
        merged.truncate(query.limit);
        Read {
            value: merged,
            missing: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Keeps `member`'s announcement, alive for [`Member::ttl`].
    pub fn announce(&self, member: &Member) {
        let mut member = member.clone();
        member.seen_at = Some(Utc::now());
        let expires = BootInstant::now() + member.ttl();
        self.lock()
            .members
            .insert(member.id.clone(), (member, expires));
    }

    /// Every member announced to this process.
    pub fn members(&self) -> Read<Vec<Member>> {
        let now = BootInstant::now();
        let state = self.lock();
        let members = state.members.values().map(|(member, expires)| {
            let mut member = member.clone();
            member.alive = now < *expires;
            member
        });
        Read {
            value: membership::merge([members.collect::<Vec<_>>()]),
            missing: Vec::new(),
            skipped: Vec::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the maps half-updated in a way that matters (each
        // update is a single insert), so a poisoned lock is used as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims every request; see [`super::Store::claim_many`].
    pub fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        let mut state = self.lock();
        requests
            .iter()
            .map(|request| self.claim(&mut state, request))
            .collect()
    }

    /// Both rounds of one claim at once: `ACQUIRE`'s checks, then `CONFIRM`'s writes.
    fn claim(&self, state: &mut State, request: &ClaimRequest) -> ClaimOutcome {
        let now = BootInstant::now();
        let ttl = self.settings.ttl;
        let tick = request.tick.as_millis();
        let [lease_key, fence_key, claim_key] = claim_keys(
            &self.settings.key_prefix,
            &request.job,
            request.tick,
            request.overlap,
        );
        if let Some((claimed, value)) = state.claims.get(&claim_key) {
            if *claimed > tick || (*claimed == tick && claimant_of(value) != request.claimant) {
                let mut by = Holder::from_value(value);
                by.tick = Some(crate::schedule::Tick(*claimed));
                return ClaimOutcome::AlreadyClaimed { by: Some(by) };
            }
        }
        if let Some((value, expires)) = state.leases.get(&lease_key) {
            if *expires > now && claimant_of(value) != request.claimant {
                let holder = Holder::from_value(value);
                let left = expires.saturating_duration_since(now);
                return if holder.tick == Some(request.tick) {
                    ClaimOutcome::Contended {
                        holder: Some(holder),
                        retry_in: left.max(self.settings.retry_delay),
                    }
                } else {
                    ClaimOutcome::Busy {
                        holder: Some(holder),
                        ttl: Some(left),
                    }
                };
            }
        }
        let fence = state.fences.get(&fence_key).copied().unwrap_or(0);
        let token = fence.saturating_add(1).max(token_floor(request.tick));
        let value = attempt_value(&request.claimant, request.tick, &request.fingerprint);
        state.fences.insert(fence_key, token);
        state.claims.insert(claim_key, (tick, value.clone()));
        state.leases.insert(lease_key, (value.clone(), now + ttl));
        let drift = validity::drift(ttl, self.settings.drift_factor);
        ClaimOutcome::Won(Lease::new(
            request,
            token,
            value,
            now + ttl.saturating_sub(drift),
        ))
    }

    /// Extends the lease if it is still held and its deadline has not passed.
    pub fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        if lease.is_lost() {
            return Err(RenewError::AlreadyLost);
        }
        let now = BootInstant::now();
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

    fn request(worker: &str, tick: i64) -> ClaimRequest {
        ClaimRequest::new(worker, "job", Tick(tick), Overlap::Skip, "f")
    }

    fn claim(store: &MemoryStore, worker: &str, tick: i64) -> ClaimOutcome {
        store.claim_many(&[request(worker, tick)]).remove(0)
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
        let first = won(claim(&store, "a", 1_000));
        assert!(matches!(
            claim(&store, "b", 1_000),
            ClaimOutcome::AlreadyClaimed { .. }
        ));
        assert!(matches!(
            claim(&store, "b", 2_000),
            ClaimOutcome::Busy { .. }
        ));
        store.release(&first);
        assert!(matches!(
            claim(&store, "b", 1_000),
            ClaimOutcome::AlreadyClaimed { .. }
        ));
        let second = won(claim(&store, "b", 2_000));
        assert!(second.token > first.token);
    }

    #[tokio::test]
    async fn expired_lease_is_lost_for_good_and_release_spares_the_next_holder() {
        let store = store(100);
        let mut a = won(claim(&store, "a", 1_000));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let b = won(claim(&store, "b", 2_000));
        assert!(b.token > a.token);
        assert_eq!(store.renew(&mut a), Err(RenewError::Expired));
        assert_eq!(store.renew(&mut a), Err(RenewError::AlreadyLost));
        store.release(&a);
        assert!(matches!(
            claim(&store, "c", 3_000),
            ClaimOutcome::Busy { .. }
        ));
    }

    #[tokio::test]
    async fn renewal_keeps_a_lease_past_its_ttl() {
        let store = store(1_000);
        let mut a = won(claim(&store, "a", 1_000));
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            store.renew(&mut a).expect("renewal within the validity");
        }
        assert!(a.is_valid());
        assert!(matches!(
            claim(&store, "b", 2_000),
            ClaimOutcome::Busy { .. }
        ));
    }

    /// Workers that disagree on `overlap` take different lease keys, but meet on the claim record: one
    /// (job, tick) is still granted once (finding 1 of the protocol review, on the embedded store).
    #[tokio::test]
    async fn workers_that_disagree_on_overlap_still_claim_a_tick_once() {
        let store = store(1_000);
        let skip = ClaimRequest::new("a", "job", Tick(1_000), Overlap::Skip, "f1");
        let allow = ClaimRequest::new("b", "job", Tick(1_000), Overlap::Allow, "f2");
        won(store.claim_many(&[skip]).remove(0));
        match store.claim_many(&[allow]).remove(0) {
            ClaimOutcome::AlreadyClaimed { by: Some(by) } => {
                assert_eq!(by.worker, "a");
                assert_eq!(by.fingerprint.as_deref(), Some("f1"));
            }
            other => panic!("expected AlreadyClaimed naming worker a, got {other:?}"),
        }
    }

    /// A request claimed again continues its own claim: its own record does not count against it.
    #[tokio::test]
    async fn a_request_claimed_again_is_not_refused_by_its_own_record() {
        let store = store(1_000);
        let request = ClaimRequest::new("a", "job", Tick(1_000), Overlap::Skip, "f");
        let first = won(store.claim_many(std::slice::from_ref(&request)).remove(0));
        store.release(&first);
        let again = won(store.claim_many(&[request]).remove(0));
        assert!(again.token > first.token);
    }
}
