//! Many claims at once on etcd: one read of every claim's keys, then several claims per write transaction.
//!
//! A batch of claims (the jobs due at one tick) costs a few transactions and a lease grant per claim that
//! may take its tick, not three requests per claim:
//!
//! 1. **Read**: every claim's keys as gets in read-only transactions of at most [`MAX_TXN_OPS`] gets
//!    (etcd's `--max-txn-ops` default), each claim's keys within one transaction, so each claim still
//!    decides on one linearizable snapshot. The transactions go out at once.
//! 2. **Decide** each claim on its snapshot, as a single claim does (`snapshot.rs`); a final outcome is
//!    handed over at once.
//! 3. **Grant** each claim that may take its tick its own etcd lease (`claim.rs` argues why the claims of
//!    a batch cannot share one).
//! 4. **Write**: each claim's compare-and-swap, unchanged, becomes a nested transaction (etcd ≥ 3.3) of
//!    an outer one that compares nothing, so it always applies its branch: every claim's own compares
//!    decide its own writes, and a failed compare refuses only that claim, whose nested else-branch reads
//!    its keys back to decide again. At most [`CLAIMS_PER_WRITE`] claims per transaction (etcd counts a
//!    nested transaction's operations against what the outer one leaves of `--max-txn-ops`), and **never
//!    two claims of one job in one transaction**: etcd refuses a transaction that writes one key twice
//!    (both would write the job's fence). Each claim's write rewrites its job's fence at the `mod_revision` read (`claim.rs`), so the
//!    tokens of a job strictly increase in grant order.
//!
//! A claim refused by its compare goes to the next round (at most `retries` more), as a single claim
//! retries. A claim whose lease grant failed wrote nothing; it is decided on its keys read again with the
//! round's unsure writes (another claimant's grant tells a loser that it lost), or else fails with the
//! grant's failure. A write transaction whose answer is lost, or that etcd refused as a whole (too large, or a
//! cluster whose `--max-txn-ops` is below the default), is settled claim by claim by reading the claims'
//! keys back (`claim.rs`: this attempt's value written since the compared read is a grant at that
//! revision); each claim of it is written alone from then on. A read transaction that fails is tried
//! again claim by claim. No request of a batch reads at a past revision (the gets read the current one,
//! the compares name the `mod_revision`s read), so a compaction refuses none of them. So every claim ends
//! with one of a single claim's outcomes, and a claim is never granted twice: whatever the grouping, what
//! writes a claim is its own compare-and-swap.

use std::collections::HashMap;

use etcd_client::{Txn, TxnOp, TxnOpResponse};
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt as _};

use super::claim::{Granted, Written};
use super::history::MAX_TXN_OPS;
use super::snapshot::{decide, record_value, Keys, Snapshot};
use super::EtcdStore;
use crate::clock::boot::BootInstant;
use crate::lock::keys::{attempt_value, Holder};
use crate::lock::{validity, ClaimOutcome, ClaimRequest};

/// The most operations one claim puts in a transaction: the gets of its (at most five) keys, or its
/// compare-and-swap's compares.
const OPS_PER_CLAIM: usize = 5;

/// The most claims one write transaction carries: etcd checks a nested transaction against what the outer
/// one's own operations (one per claim) leave of `--max-txn-ops`.
pub(super) const CLAIMS_PER_WRITE: usize = MAX_TXN_OPS - OPS_PER_CLAIM;

/// One claim of a batch, as it goes.
struct Claim<'a> {
    /// The request's index in the batch.
    index: usize,
    request: &'a ClaimRequest,
    keys: Keys,
    /// This attempt's lease value.
    value: String,
    /// The end of the lease's validity, from a stopwatch started before any etcd lease was granted.
    deadline: BootInstant,
    /// What the claim decides on: its keys as last read.
    snapshot: Snapshot,
    /// The token its next write gives, from that snapshot ([`Snapshot::next_token`]).
    token: u64,
    granted: Option<Granted>,
    /// Its last write went in a transaction that failed as a whole: written alone from now on.
    alone: bool,
}

/// What became of one claim after a round (short-lived, one per claim and round: not boxed).
#[allow(clippy::large_enum_variant)]
enum Step<'a> {
    Decided(usize, ClaimOutcome),
    Again(Claim<'a>),
}

impl EtcdStore {
    /// Claims every request (see the module's doc), handing each outcome to `decided` with the request's
    /// index as soon as it is known; every request gets exactly one.
    pub(super) async fn claim_batch(
        &self,
        requests: &[ClaimRequest],
        decided: &mut impl FnMut(usize, ClaimOutcome),
    ) {
        let settings = &self.settings;
        // The stopwatch starts before any etcd lease can be granted, so the validity computed from it
        // never outlives a lease on the leader's clock (under the bounded drift rate).
        let deadline = BootInstant::now()
            + settings
                .ttl
                .saturating_sub(validity::drift(settings.ttl, settings.drift_factor));
        let mut claims = Vec::new();
        for (index, read) in self
            .read_claims(requests, deadline)
            .await
            .into_iter()
            .enumerate()
        {
            match read {
                Ok(claim) => claims.push(claim),
                Err(why) => decided(index, ClaimOutcome::NoQuorum(self.failure(why))),
            }
        }
        for _ in 0..=settings.retries {
            if claims.is_empty() {
                return;
            }
            claims = self.round(claims, decided).await;
        }
        for claim in claims {
            self.unused(claim.granted);
            // The keys kept changing under us (other workers' claims of this job): not final, try again.
            let holder = claim.snapshot.lease.as_ref();
            let outcome = ClaimOutcome::Contended {
                holder: holder.map(|lease| Holder::from_value(&lease.value)),
                retry_in: settings.retry_delay,
            };
            decided(claim.index, outcome);
        }
    }

    /// Each request's claim as read ([`EtcdStore::read_all`]), in order, with the validity's `deadline`.
    async fn read_claims<'a>(
        &self,
        requests: &'a [ClaimRequest],
        deadline: BootInstant,
    ) -> Vec<Result<Claim<'a>, String>> {
        let prefix = &self.settings.key_prefix;
        let keys: Vec<Keys> = requests.iter().map(|r| Keys::of(prefix, r)).collect();
        let snapshots = self.read_all(&keys.iter().collect::<Vec<_>>()).await;
        let read = requests
            .iter()
            .enumerate()
            .zip(keys.into_iter().zip(snapshots));
        read.map(|((index, request), (keys, snapshot))| {
            Ok(Claim {
                index,
                request,
                value: attempt_value(
                    &request.claimant,
                    request.tick,
                    &request.fingerprint,
                    &request.series,
                ),
                keys,
                deadline,
                snapshot: snapshot?,
                token: 0,
                granted: None,
                alone: false,
            })
        })
        .collect()
    }

    /// One round: decide each claim on its snapshot, grant the etcd leases of those that may take their
    /// tick, write them, and settle each write; returns the claims to decide again.
    async fn round<'a>(
        &self,
        claims: Vec<Claim<'a>>,
        decided: &mut impl FnMut(usize, ClaimOutcome),
    ) -> Vec<Claim<'a>> {
        let released = |value: &str| self.was_released(value);
        let mut writing = Vec::new();
        for mut claim in claims {
            let retry_delay = self.settings.retry_delay;
            match decide(claim.request, &claim.snapshot, retry_delay, &released) {
                Some(outcome) => {
                    self.unused(claim.granted);
                    decided(claim.index, outcome);
                }
                None => match claim.snapshot.next_token(claim.request.tick) {
                    Ok(token) => {
                        claim.token = token;
                        writing.push(claim);
                    }
                    Err(refusal) => {
                        self.unused(claim.granted);
                        decided(claim.index, ClaimOutcome::Refused(refusal));
                    }
                },
            }
        }
        // Each claim's etcd lease, granted once per claim and kept across its rounds.
        let grants = join_all(writing.iter().map(|claim| async move {
            match claim.granted {
                Some(ids) => Ok(ids),
                None => self.grant(claim.request).await,
            }
        }))
        .await;
        let (mut granted, mut ungranted) = (Vec::new(), Vec::new());
        for (mut claim, ids) in writing.into_iter().zip(grants) {
            match ids {
                Ok(ids) => {
                    claim.granted = Some(ids);
                    granted.push(claim);
                }
                Err(why) => ungranted.push((claim, why)),
            }
        }
        let mut writes: FuturesUnordered<_> = groups(granted)
            .into_iter()
            .map(|group| async move {
                let written = self.write_group(&group).await;
                (group, written)
            })
            .collect();
        let (mut again, mut unsure) = (Vec::new(), Vec::new());
        while let Some((group, written)) = writes.next().await {
            match written {
                Ok(each) => {
                    for (claim, written) in group.into_iter().zip(each) {
                        match written {
                            Ok(Written::Applied(revision)) => {
                                let outcome = self.claim_won(&claim, claim.token, revision);
                                decided(claim.index, outcome);
                            }
                            // Refused: perhaps because this very write applied already (a copy sent
                            // to another member while the first went unanswered, see `cluster.rs`).
                            Ok(Written::Changed(now)) => match self.settle(claim, now) {
                                Step::Decided(index, outcome) => decided(index, outcome),
                                Step::Again(claim) => again.push(claim),
                            },
                            Err(why) => unsure.push((claim, why)),
                        }
                    }
                }
                // Lost, or refused as a whole: the writes may or may not have applied.
                Err(why) => {
                    let alone = group.len() > 1;
                    unsure.extend(group.into_iter().map(|mut claim| {
                        claim.alone |= alone;
                        (claim, why.clone())
                    }));
                }
            }
        }
        // One read settles both the writes that may have applied and the claims whose grant failed.
        let keys: Vec<&Keys> = unsure
            .iter()
            .chain(&ungranted)
            .map(|(claim, _)| &claim.keys)
            .collect();
        let mut now = self.read_all(&keys).await;
        let now_ungranted = now.split_off(unsure.len());
        // A claim whose etcd lease was not granted (a busy or failing cluster: the grants of a batch go
        // out at once, each bounded by the node timeout) wrote nothing. Its keys as read now may decide it
        // — another claimant took the tick meanwhile, and a loser learns that it lost; else the grant's
        // failure is its outcome.
        for ((claim, why), now) in ungranted.into_iter().zip(now_ungranted) {
            let retry_delay = self.settings.retry_delay;
            let outcome = now
                .ok()
                .and_then(|now| decide(claim.request, &now, retry_delay, &released))
                .unwrap_or_else(|| ClaimOutcome::NoQuorum(self.failure(why)));
            decided(claim.index, outcome);
        }
        for ((claim, why), now) in unsure.into_iter().zip(now) {
            match now {
                Ok(now) => match self.settle(claim, now) {
                    Step::Decided(index, outcome) => decided(index, outcome),
                    Step::Again(claim) => again.push(claim),
                },
                Err(_) => {
                    // The record's etcd lease is left to expire: the write may have bound it.
                    if let Some(ids) = claim.granted {
                        self.revoke_later(ids.lease);
                    }
                    decided(claim.index, ClaimOutcome::NoQuorum(self.failure(why)));
                }
            }
        }
        again
    }

    /// Whether the claim's write applied, as its keys read since say: the record holds this attempt's
    /// value, written after the read its compares used (an earlier claim of the same claimant wrote the
    /// same value), and the fence written with it (the same `mod_revision`) holds its token. Else — also
    /// when a later grant of the job rewrote the fence since, so that the token is unknown — it decides
    /// again on `now` (this claimant goes on from its own record, with a new token).
    fn settle<'a>(&self, mut claim: Claim<'a>, now: Snapshot) -> Step<'a> {
        let compared = claim
            .snapshot
            .claim
            .as_ref()
            .map_or(0, |seen| seen.mod_revision);
        let token = match (&now.claim, &now.fence) {
            (Some(record), Some(fence))
                if record.value == record_value(claim.request.tick, &claim.value)
                    && record.mod_revision > compared
                    && fence.mod_revision == record.mod_revision =>
            {
                fence
                    .value
                    .parse::<u64>()
                    .ok()
                    .map(|t| (t, record.mod_revision))
            }
            _ => None,
        };
        match token {
            Some((token, revision)) => {
                let outcome = self.claim_won(&claim, token, revision);
                Step::Decided(claim.index, outcome)
            }
            None => {
                claim.snapshot = now;
                Step::Again(claim)
            }
        }
    }

    /// The grant of `claim` with `token`, written at `revision` ([`EtcdStore::won`]).
    fn claim_won(&self, claim: &Claim<'_>, token: u64, revision: i64) -> ClaimOutcome {
        let lease = claim.granted.map_or(0, |ids| ids.lease);
        self.won(
            claim.request,
            token,
            revision,
            claim.value.clone(),
            lease,
            claim.deadline,
        )
    }

    /// Every claim's keys, read in read-only transactions of at most [`MAX_TXN_OPS`] gets sent at once,
    /// each claim's keys in one transaction (one snapshot); a transaction that fails is tried again claim
    /// by claim, so one claim's trouble (or a cluster with a lower `--max-txn-ops`) is its own.
    async fn read_all(&self, keys: &[&Keys]) -> Vec<Result<Snapshot, String>> {
        let mut chunks: Vec<Vec<&Keys>> = Vec::new();
        let mut gets = 0;
        for claim in keys {
            let n = claim.all().count();
            match chunks.last_mut() {
                Some(chunk) if gets + n <= MAX_TXN_OPS => chunk.push(claim),
                _ => {
                    chunks.push(vec![claim]);
                    gets = 0;
                }
            }
            gets += n;
        }
        let reads = join_all(chunks.iter().map(|chunk| self.read_chunk(chunk))).await;
        let mut snapshots = Vec::with_capacity(keys.len());
        for (chunk, read) in chunks.iter().zip(reads) {
            match read {
                Ok(read) => snapshots.extend(read),
                Err(_) if chunk.len() > 1 => {
                    let alone = join_all(chunk.iter().map(|keys| self.read(keys))).await;
                    snapshots.extend(alone);
                }
                Err(why) => snapshots.push(Err(why)),
            }
        }
        snapshots
    }

    /// The keys of every claim of `chunk` in one read-only transaction, each claim's snapshot in order.
    async fn read_chunk(&self, chunk: &[&Keys]) -> Result<Vec<Result<Snapshot, String>>, String> {
        let gets: Vec<TxnOp> = chunk.iter().flat_map(|keys| keys.gets()).collect();
        let answer = self
            .txn(self.settings.node_timeout, Txn::new().and_then(gets))
            .await?;
        let responses = answer.op_responses();
        let mut at = 0;
        Ok(chunk
            .iter()
            .map(|keys| {
                let snapshot = Snapshot::from_responses(keys, responses.get(at..).unwrap_or(&[]));
                at += keys.all().count();
                snapshot
            })
            .collect())
    }

    /// The compare-and-swaps of `group` in one transaction: a claim alone as it is, several as nested
    /// transactions of one that compares nothing; each claim's own answer, or an error for all when the
    /// transaction's answer is lost or it is refused as a whole.
    async fn write_group(
        &self,
        group: &[Claim<'_>],
    ) -> Result<Vec<Result<Written, String>>, String> {
        let cas = |claim: &Claim<'_>| {
            let ids = claim.granted.ok_or("no etcd lease granted")?;
            Ok::<_, String>(self.cas(
                &claim.keys,
                &claim.snapshot,
                claim.request,
                &claim.value,
                claim.token,
                ids,
            ))
        };
        if let [claim] = group {
            return self
                .write(&claim.keys, cas(claim)?)
                .await
                .map(|w| vec![Ok(w)]);
        }
        let nested = group.iter().map(|claim| cas(claim).map(TxnOp::txn));
        let nested = nested.collect::<Result<Vec<TxnOp>, String>>()?;
        let answer = self
            .txn(self.settings.node_timeout, Txn::new().and_then(nested))
            .await?;
        // Every write of a transaction has its revision, which the header carries.
        let revision = answer.header().map_or(0, |h| h.revision());
        let responses = answer.op_responses();
        Ok(group
            .iter()
            .enumerate()
            .map(|(i, claim)| match responses.get(i) {
                Some(TxnOpResponse::Txn(own)) if own.succeeded() => Ok(Written::Applied(revision)),
                Some(TxnOpResponse::Txn(own)) => {
                    Snapshot::from_responses(&claim.keys, own.op_responses().as_slice())
                        .map(Written::Changed)
                }
                _ => Err("unexpected transaction answer".to_string()),
            })
            .collect())
    }
}

/// The write transactions of a round: at most [`CLAIMS_PER_WRITE`] claims each, never two claims of one
/// job in one (the `k`-th claim of a job goes in a transaction of the `k`-th layer), and a claim whose
/// last transaction failed as a whole alone.
fn groups<'a>(claims: Vec<Claim<'a>>) -> Vec<Vec<Claim<'a>>> {
    let mut groups = Vec::new();
    let mut layers: Vec<Vec<Claim<'a>>> = Vec::new();
    let mut seen: HashMap<&'a str, usize> = HashMap::new();
    for claim in claims {
        if claim.alone {
            groups.push(vec![claim]);
            continue;
        }
        let request: &'a ClaimRequest = claim.request;
        let layer = seen.entry(request.job.as_str()).or_default();
        if layers.len() <= *layer {
            layers.push(Vec::new());
        }
        layers[*layer].push(claim);
        *layer += 1;
    }
    for layer in layers {
        let mut layer = layer.into_iter().peekable();
        while layer.peek().is_some() {
            groups.push(layer.by_ref().take(CLAIMS_PER_WRITE).collect());
        }
    }
    groups
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
