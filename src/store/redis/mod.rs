//! The Redlock store on N independent Redis nodes.
//!
//! A claim of `(job, tick)` takes two rounds, each sent to every node in parallel as one pipeline that
//! carries all the claims due at that instant:
//!
//! 1. [`scripts::ACQUIRE`]: take the lease unless another claimant confirmed the tick or holds the lease;
//!    learn each node's fence counter. A majority of `ok` answers lets the claim go on, with the fencing
//!    token `max(highest fence seen + 1, token_floor(tick))`.
//! 2. [`scripts::CONFIRM`]: on each node where our lease value still holds, raise the fence counter to the
//!    token and record the tick as confirmed by this claimant. The claim is granted only when a majority
//!    confirms before the lease's validity (`ttl − elapsed − drift`, measured on the boot clock from before
//!    round 1) ends.
//!
//! Every round returns as soon as its outcome is known — a majority agreed, or a majority can no longer
//! agree — and never waits for a slow or hung node longer than `node_timeout`. The safety argument is in
//! `docs/protocol.md`.
//!
//! Files: this one holds the store's construction and its claims, leases and health (the capabilities of
//! [`crate::store::capability`]), and the plain lease; `claim.rs` the two rounds of a claim and the
//! reading of a lost one; `scripts.rs` the Lua scripts, with their safety arguments; `node.rs` one node's
//! connection and the redaction of its password; `round.rs` how one pipeline goes to every node
//! (waiting as long as `crate::store::pace` says while the nodes answer slowly); `keeper.rs` the
//! batching of renewals and releases; `reply.rs` the parsing of the scripts' replies; `time.rs` the
//! nodes' clocks (`TIME`), for cluster time and readiness; `history.rs` run history and membership;
//! `pause.rs` pauses; `triggers.rs` trigger requests.

mod admission;
mod claim;
mod cluster;
#[cfg(test)]
mod decision_tests;
mod history;
mod keeper;
pub(crate) mod node;
mod pause;
mod reply;
mod round;
pub mod scripts;
mod sentinel;
mod time;
mod triggers;

use std::future::Future;
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use tokio::time::Instant;

pub use self::cluster::slot as key_slot;
use self::node::Node;
use self::reply::{parse_integer, parse_set};
use self::round::Shape;
use self::scripts::Calls;
use super::{Claims, GroupState, Health, Leases, StoreError};
use crate::clock::boot::BootInstant;
use crate::clock::cluster::Readings;
use crate::config::{RedisConfig, RedisNode};
use crate::history::HistorySettings;
use crate::lock::keys::{attempt_value, claim_keys, lease_key};
use crate::lock::quorum::{quorum, Vote};
use crate::lock::{
    validity, ClaimOutcome, ClaimRequest, Lease, LockSettings, Overlap, RenewError, Series,
};
use crate::schedule::Tick;

/// Leases, claims and fencing tokens on a majority of N independent Redis nodes.
#[derive(Clone)]
pub struct RedisStore {
    settings: LockSettings,
    history: HistorySettings,
    nodes: Arc<Vec<Node>>,
    /// The same nodes on connections of their own for history reads ([`Records::history`]), which may
    /// carry megabytes: on the lock's connections they would queue claims and renewals behind them.
    readers: Arc<Vec<Node>>,
    /// How many history reads may be under way at once ([`HISTORY_READS`]): each costs every node the
    /// time to gather and send the whole answer, during which it serves nothing else.
    reads: Arc<tokio::sync::Semaphore>,
    /// How much longer than configured rounds wait while the nodes answer slowly ([`crate::store::pace`]).
    pace: Arc<crate::store::pace::Pace>,
    /// Whether the store is a Redis Cluster, whose script calls must each stay on one slot
    /// ([`Calls::new`]).
    per_slot: bool,
    /// Sends renewals and releases together ([`keeper`]); `None` in the keeper's own copy.
    keeper: Option<Arc<keeper::Keeper>>,
    /// The last full list of trigger requests, read again only when it changed ([`triggers`]).
    last_list: Arc<triggers::LastList>,
}

/// How many history reads one store runs at once; more wait their turn (within the read's own budget).
const HISTORY_READS: usize = 2;

/// One request in one attempt.
struct Try<'a> {
    request: &'a ClaimRequest,
    /// The lease value kept from the previous attempt (we led a split vote), or `None` for a new attempt.
    value: Option<String>,
    /// Whether this attempt may keep its keys for a retry (it has attempts left).
    may_keep: bool,
}

/// The result of one attempt at one claim.
enum Attempt {
    Won(Lease),
    /// Lost: the outcome to report, and whether another attempt could change it.
    Lost {
        outcome: ClaimOutcome,
        retry: Retry,
    },
}

/// Whether, and how, a lost attempt is tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Retry {
    /// Not within this call: the outcome is final, or (too many nodes failed) only worth retrying after
    /// a backoff that the caller chooses.
    No,
    /// A contender between its rounds, an ambiguous round 2, or a split vote we lead on our last attempt:
    /// undo, and retry after the delay plus jitter.
    Later,
    /// A split vote that another contender leads: undo, and retry only once the leader has had its next
    /// round to pick up the nodes we free ([`RedisStore::yield_delay`]), plus jitter.
    Yield,
    /// A split vote that we lead: keep our keys (this value) and retry soon.
    Soon(String),
}

impl RedisStore {
    /// Prepares the store on the servers at `urls`; connections open in the background and re-open by
    /// themselves.
    ///
    /// Must be called inside a Tokio runtime. Fails only on URLs that cannot name a Redis node.
    pub fn new(urls: &[String], settings: LockSettings) -> Result<RedisStore, StoreError> {
        let config = RedisConfig::on(urls.iter().cloned().map(RedisNode::Server).collect());
        RedisStore::open(&config, settings)
    }

    /// Prepares the store on `config`'s nodes, servers and Sentinel groups (whose watchers start here),
    /// with its TLS certificates (read now); as [`RedisStore::new`] otherwise.
    pub fn open(config: &RedisConfig, settings: LockSettings) -> Result<RedisStore, StoreError> {
        let nodes = &config.nodes;
        if nodes.is_empty() {
            return Err(StoreError::NoNodes(0));
        }
        // `rediss://` nodes need a TLS crypto provider; rustls no longer picks one by itself. Installing
        // fails only if one is already installed, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certificates = node::certificates(&config.tls)?;
        // Held off after a restart: the TTL and its drift, by when every lease of before it has expired
        // or been renewed (which restores it on the node), and every round under way then has ended.
        let hold = settings.ttl + validity::drift(settings.ttl, settings.drift_factor);
        // One target per node, shared by its lock and read connections (a group's watcher runs once).
        let targets = nodes
            .iter()
            .map(|node| node::Target::of(node, certificates.as_ref(), hold))
            .collect::<Result<Vec<_>, _>>()?;
        let labels = targets.iter().map(|(label, _)| label.clone()).collect();
        let behind = nodes
            .iter()
            .map(|node| match node {
                // A cluster keeps its shards' standing in a registry of its own.
                RedisNode::Server(_) | RedisNode::Cluster(_) => admission::Behind::Server,
                RedisNode::Sentinel(group) => admission::Behind::Group {
                    follows_promotions: group.min_replicas_acked.any(),
                },
            })
            .collect();
        let registry = Arc::new(admission::Registry::new(labels, hold, behind));
        let open = || {
            targets
                .iter()
                .enumerate()
                .map(|(index, (label, target))| {
                    let registry = Arc::clone(&registry);
                    Node::new(
                        label.clone(),
                        target.clone(),
                        index,
                        settings.node_timeout,
                        registry,
                    )
                })
                .collect::<Vec<_>>()
        };
        let (nodes, readers) = (open(), open());
        nodes.iter().for_each(Node::warm_up);
        let per_slot = matches!(config.nodes.as_slice(), [RedisNode::Cluster(_)]);
        Ok(RedisStore {
            settings,
            per_slot,
            history: HistorySettings::default(),
            nodes: Arc::new(nodes),
            readers: Arc::new(readers),
            reads: Arc::new(tokio::sync::Semaphore::new(HISTORY_READS)),
            pace: Arc::default(),
            keeper: None,
            last_list: Arc::default(),
        }
        .with_keeper())
    }

    /// The nodes' addresses, without passwords.
    pub(crate) fn node_labels(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.label.clone()).collect()
    }

    /// The same store with its lease keeper started (its own copy has none).
    fn with_keeper(self) -> RedisStore {
        let keeper = keeper::Keeper::start(RedisStore {
            keeper: None,
            ..self.clone()
        });
        RedisStore {
            keeper: Some(Arc::new(keeper)),
            ..self
        }
    }

    /// The same store with `history` as its history bound.
    pub fn with_history(self, history: HistorySettings) -> RedisStore {
        RedisStore { history, ..self }
    }

    /// A plain Redlock lease on `resource`: `SET NX PX` on every node, no tick claim and no fencing token
    /// (the lease's token is 0). One round trip; the lease renews and releases like a claimed one.
    ///
    /// For callers that need mutual exclusion only; the worker always claims ticks with
    /// [`RedisStore::claim_many`].
    pub async fn acquire_lease(&self, worker_id: &str, resource: &str) -> ClaimOutcome {
        let request = ClaimRequest::new(worker_id, resource, Tick(0), Overlap::Skip, "");
        let [key, ..] = claim_keys(
            &self.settings.key_prefix,
            resource,
            request.tick,
            request.overlap,
            &request.series,
        );
        let value = attempt_value(&request.claimant, request.tick, "", &request.series);
        let start = BootInstant::now();
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("SET")
            .arg(&key)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(self.settings.ttl.as_millis() as u64);
        let answers = self
            .round(
                (pipeline, Shape::Commands),
                self.settings.node_timeout,
                self.settings.ttl / 4,
                parse_set,
                Err,
                |answer| match answer {
                    Ok(true) => Vote::Granted,
                    Ok(false) => Vote::Refused,
                    Err(why) => Vote::Failed(why.clone()),
                },
            )
            .await;
        let answers = answers.into_iter().next().unwrap_or_default();
        let granted = answers.iter().filter(|(_, a)| a == &Ok(true)).count();
        let drift = validity::drift(self.settings.ttl, self.settings.drift_factor);
        if granted >= quorum(self.nodes.len())
            && validity::validity(
                self.settings.ttl,
                start.elapsed(),
                self.settings.drift_factor,
            )
            .is_some()
        {
            return ClaimOutcome::Won(Lease::new(
                &request,
                0,
                value,
                start + self.settings.ttl.saturating_sub(drift),
            ));
        }
        let undo = Calls::new(
            &scripts::RELEASE,
            [([key], [value.as_str()])],
            self.per_slot,
        );
        self.spawn_everywhere(undo.pipeline);
        let refused = answers.iter().filter(|(_, a)| a == &Ok(false)).count();
        if refused > 0 {
            return ClaimOutcome::Busy {
                holder: None,
                ttl: None,
            };
        }
        let answered: Vec<usize> = answers.iter().map(|(node, _)| *node).collect();
        let failures = answers
            .into_iter()
            .filter_map(|(node, a)| a.err().map(|why| (node, why)));
        ClaimOutcome::NoQuorum(self.quorum_failure(failures, granted, answered.into_iter()))
    }

    /// Renews every lease of `leases` in one round (one pipeline per node), each decided on its own: the
    /// leases with the outcome of each.
    pub(super) async fn renew_each(
        &self,
        mut leases: Vec<Lease>,
    ) -> Vec<(Lease, Result<(), RenewError>)> {
        let settings = &self.settings;
        let ttl_ms = settings.ttl.as_millis().to_string();
        let mut outcomes: Vec<Option<Result<(), RenewError>>> =
            leases.iter().map(|_| None).collect();
        // Each renewal's stopwatch starts before its pipeline is sent.
        let mut sent: Vec<(usize, BootInstant)> = Vec::new();
        // Per renewal: the lease, fence and claim keys; the value, the token, and the tick of a scheduled
        // run (what `RENEW` puts back on a node that forgot the lease).
        let mut renewals: Vec<([String; 3], [String; 3])> = Vec::new();
        for (index, lease) in leases.iter_mut().enumerate() {
            match lease.start_renewal() {
                Ok(start) => {
                    let [key, fence, claim, _] = claim_keys(
                        &settings.key_prefix,
                        &lease.job,
                        lease.tick,
                        lease.overlap,
                        &lease.series,
                    );
                    let tick = match lease.series {
                        Series::Schedule => lease.tick.as_millis().to_string(),
                        _ => String::new(),
                    };
                    renewals.push((
                        [key, fence, claim],
                        [lease.value.clone(), lease.token.to_string(), tick],
                    ));
                    sent.push((index, start));
                }
                Err(error) => outcomes[index] = Some(Err(error)),
            }
        }
        if !sent.is_empty() {
            // No renewal is granted after its lease's deadline (see `judge_renewal`), so the round need
            // not outlast the latest one. Nor is it stretched (see `pace`), nor longer for its batch (the
            // keeper keeps renewal batches small): the watchdog's slack counts on `node_timeout`.
            let configured = settings.node_timeout;
            let latest = sent
                .iter()
                .map(|(index, start)| leases[*index].deadline().saturating_duration_since(*start))
                .max()
                .unwrap_or_default();
            let calls = Calls::new(
                &scripts::RENEW,
                renewals.iter().map(|(keys, [value, token, tick])| {
                    (
                        keys,
                        [
                            value.as_str(),
                            ttl_ms.as_str(),
                            token.as_str(),
                            tick.as_str(),
                        ],
                    )
                }),
                self.per_slot,
            );
            let answers = self
                .round(
                    calls.for_round(),
                    configured,
                    configured.min(latest),
                    parse_integer,
                    Err,
                    |answer| match answer {
                        Ok(1) => Vote::Granted,
                        Ok(_) => Vote::Refused,
                        Err(why) => Vote::Failed(why.clone()),
                    },
                )
                .await;
            for ((index, start), answers) in sent.into_iter().zip(answers) {
                outcomes[index] = Some(self.judge_renewal(&mut leases[index], start, &answers));
            }
        }
        leases
            .into_iter()
            .zip(outcomes)
            .map(|(lease, outcome)| (lease, outcome.unwrap_or(Err(RenewError::AlreadyLost))))
            .collect()
    }

    /// What the nodes' `answers` to the renewal of `lease` started at `start` come to: extended when a
    /// majority granted it before the deadline; lost for good when a majority answered that the value is
    /// gone, or the deadline passed; unconfirmed otherwise.
    ///
    /// A renewal confirmed after the deadline proves nothing about the time in between, when another holder
    /// may have taken the lease.
    fn judge_renewal(
        &self,
        lease: &mut Lease,
        start: BootInstant,
        answers: &[(usize, Result<i64, String>)],
    ) -> Result<(), RenewError> {
        let settings = &self.settings;
        let granted = answers.iter().filter(|(_, a)| a == &Ok(1)).count();
        let refused = answers
            .iter()
            .filter(|(_, a)| matches!(a, Ok(n) if *n != 1))
            .count();
        let needed = quorum(self.nodes.len());
        if granted >= needed {
            if BootInstant::now() >= lease.deadline() {
                lease.mark_lost();
                return Err(RenewError::Expired);
            }
            let drift = validity::drift(settings.ttl, settings.drift_factor);
            lease.extend_to(start + settings.ttl.saturating_sub(drift));
            return Ok(());
        }
        let failure = self.quorum_failure(
            answers.iter().filter_map(|(node, answer)| match answer {
                Ok(1) => None,
                Ok(_) => Some((*node, "lease not held".to_string())),
                Err(why) => Some((*node, why.clone())),
            }),
            granted,
            answers.iter().map(|(node, _)| *node),
        );
        if refused > self.nodes.len() - needed || BootInstant::now() >= lease.deadline() {
            // A majority answered that our value is gone (or the deadline passed): the lease cannot be
            // held by us on a majority any more. It stays lost.
            lease.mark_lost();
            return Err(if refused > self.nodes.len() - needed {
                RenewError::NotHeld(failure)
            } else {
                RenewError::Expired
            });
        }
        Err(RenewError::Unconfirmed(failure))
    }

    /// Releases every lease of `leases` in one pipeline per node; see [`RedisStore::release`].
    pub(super) async fn release_each(&self, leases: &[Lease]) {
        let calls = Calls::new(
            &scripts::RELEASE,
            leases.iter().map(|lease| {
                let key = lease_key(&self.settings.key_prefix, lease);
                ([key], [lease.value.as_str()])
            }),
            self.per_slot,
        );
        let pipeline = Arc::new(calls.pipeline);
        let bound = self.settings.ttl;
        // Each future owns what it needs, so the stragglers can move to a background task. Every request is
        // handed to its node's connection on the first poll, so it is sent whoever awaits the answer.
        let mut all: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|index| {
                let (nodes, pipeline) = (Arc::clone(&self.nodes), Arc::clone(&pipeline));
                async move { nodes[index].eval(&pipeline, bound).await }
            })
            .collect();
        let needed = quorum(self.nodes.len());
        let majority = async {
            let mut answered = 0;
            while answered < needed {
                match all.next().await {
                    Some(Ok(_)) => answered += 1,
                    Some(Err(_)) => {}
                    None => break,
                }
            }
        };
        let budget = claim::batch_budget(self.settings.node_timeout, leases.len());
        let _ = tokio::time::timeout(budget, majority).await;
        if !all.is_empty() {
            tokio::spawn(async move { while all.next().await.is_some() {} });
        }
    }
}

impl Health for RedisStore {
    /// The nodes' addresses, without passwords, separated by commas.
    fn describe(&self) -> String {
        self.node_labels().join(",")
    }

    fn nodes(&self) -> Vec<String> {
        self.node_labels()
    }

    /// Each Sentinel group among the nodes, in their order.
    fn groups(&self) -> Vec<GroupState> {
        self.nodes.iter().flat_map(Node::group_states).collect()
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn settings(&self) -> &LockSettings {
        &self.settings
    }

    fn history_settings(&self) -> &HistorySettings {
        &self.history
    }

    async fn read_clocks(&self) -> Option<Readings> {
        Some(self.read_time().await)
    }

    /// The readings of `TIME` on every node: `/readyz` judges from them whether a majority answered.
    async fn readiness(&self) -> Result<Option<Readings>, String> {
        Ok(Some(self.read_time().await))
    }

    /// Opens and identifies every node's connection, all at once and each within its connection timeout
    /// (2 s, or 4 × `node_timeout` if longer), so that the checks' errors and warnings are logged at start
    /// and two names of one server are told apart before any claim (`admission`). Never fails: a node
    /// down or refused at start is a failed vote, and is identified again when it answers.
    async fn prepare(&self) -> Result<(), StoreError> {
        let timeout = std::time::Duration::from_secs(2).max(self.settings.node_timeout * 4);
        let opening: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| node.identify(timeout))
            .collect();
        opening.collect::<Vec<_>>().await;
        Ok(())
    }
}

impl Claims for RedisStore {
    /// Claims every request, retrying split votes and ambiguous rounds up to `retries` more times; see
    /// [`super::Store::claim_many`].
    ///
    /// A split vote (no holder with a majority) is broken in two ways. The contender with the most votes
    /// (ties to the smallest value, which every contender sees alike) keeps its keys and retries soon, so
    /// it picks up the nodes the others free; the others undo and retry after the leader's next round
    /// ([`RedisStore::yield_delay`]) plus random jitter, by which time they usually find the leader
    /// holding a majority and stop.
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        let mut outcomes: Vec<Option<ClaimOutcome>> = requests.iter().map(|_| None).collect();
        self.claim_each(requests, |index, outcome| outcomes[index] = Some(outcome))
            .await;
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| ClaimOutcome::unanswered(self.nodes.len())))
            .collect()
    }

    /// Claims every request like [`RedisStore::claim_many`], handing each outcome to `decided` (with the
    /// request's index) as soon as it is final for this call, so that a claim won in the first attempt is
    /// acted on while split votes of the same batch are still being retried. Every request gets exactly
    /// one outcome.
    async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        // Per pending request: when it may go again, how many attempts are left, and a value it kept.
        let mut pending: Vec<(usize, Instant, u32, Option<String>)> = (0..requests.len())
            .map(|index| (index, Instant::now(), self.settings.retries, None))
            .collect();
        while !pending.is_empty() {
            let ready_at = pending
                .iter()
                .map(|p| p.1)
                .min()
                .unwrap_or_else(Instant::now);
            // Only sleep for a retry: a timer, even an expired one, waits for the next millisecond tick.
            if ready_at > Instant::now() {
                tokio::time::sleep_until(ready_at).await;
            }
            let (ready, waiting) = next_attempt(
                pending,
                |p| p.1,
                Instant::now(),
                scripts::CLAIMS_PER_ATTEMPT,
            );
            pending = waiting;
            let batch: Vec<Try<'_>> = ready
                .iter()
                .map(|(index, _, left, value)| Try {
                    request: &requests[*index],
                    value: value.clone(),
                    may_keep: *left > 0,
                })
                .collect();
            let results = self.attempt(&batch).await;
            // One retry time per kind for the whole batch, so that its retries travel together again (one
            // round trip per node) instead of one by one at scattered instants. The random jitter breaks
            // the symmetry between contenders; it need not differ between the jobs of one contender.
            let (base, done) = (self.settings.retry_delay, Instant::now());
            let jitter = base.mul_f64(rand::rng().random::<f64>());
            let soon = done + base / 4;
            let later = done + base + jitter;
            let yielded = done + self.yield_delay(batch.len()) + jitter;
            for ((index, _, left, _), result) in ready.into_iter().zip(results) {
                match result {
                    Attempt::Won(lease) => decided(index, ClaimOutcome::Won(lease)),
                    Attempt::Lost {
                        retry: Retry::Soon(value),
                        ..
                    } if left > 0 => {
                        pending.push((index, soon, left - 1, Some(value)));
                    }
                    Attempt::Lost {
                        retry: Retry::Later,
                        ..
                    } if left > 0 => {
                        pending.push((index, later, left - 1, None));
                    }
                    Attempt::Lost {
                        retry: Retry::Yield,
                        ..
                    } if left > 0 => {
                        pending.push((index, yielded, left - 1, None));
                    }
                    Attempt::Lost { outcome, .. } => decided(index, outcome),
                }
            }
        }
    }
}

/// Splits `pending` into the claims of the next attempt — those due by `now`, at most `most`, in their
/// order — and the rest, in theirs: what is due already goes in the attempt after, as soon as this one is
/// decided ([`scripts::CLAIMS_PER_ATTEMPT`]).
fn next_attempt<T>(
    pending: Vec<T>,
    due: impl Fn(&T) -> Instant,
    now: Instant,
    most: usize,
) -> (Vec<T>, Vec<T>) {
    let (mut ready, mut rest): (Vec<T>, Vec<T>) = pending.into_iter().partition(|p| due(p) <= now);
    if ready.len() > most {
        rest.extend(ready.drain(most..));
    }
    (ready, rest)
}

impl Leases for RedisStore {
    /// Extends the lease if a majority still holds it, before its deadline; see [`super::Store::renew`].
    /// Goes out with the other renewals asked for meanwhile ([`keeper`]).
    async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        let outcome = match &self.keeper {
            Some(keeper) => keeper.renew(lease).await,
            None => None,
        };
        let (renewed, result) = match outcome {
            Some(outcome) => outcome,
            None => self
                .renew_each(vec![lease.clone()])
                .await
                .pop()
                .unwrap_or((lease.clone(), Err(RenewError::AlreadyLost))),
        };
        *lease = renewed;
        result
    }

    /// Never: a Redis lease ends only as its renewals say.
    fn lease_gone<'a>(&'a self, _lease: &Lease) -> impl Future<Output = ()> + Send + use<'a> {
        std::future::pending()
    }

    /// Compare-and-delete on every node, with the other releases asked for meanwhile ([`keeper`]).
    /// Returns once a majority has answered (or the round's budget has passed); the other nodes' answers
    /// are awaited in the background, bounded by the TTL (after which the key is gone anyway), so a slow or
    /// hung node never delays the caller.
    async fn release(&self, lease: &Lease) {
        if let Some(keeper) = &self.keeper {
            if keeper.release(lease, false).await {
                return;
            }
        }
        self.release_each(std::slice::from_ref(lease)).await;
    }

    /// As [`RedisStore::release`], after waiting up to 10 ms for other runs' releases to travel in the same
    /// script call (the keeper's `RELEASE_GATHER`).
    async fn release_soon(&self, lease: &Lease) {
        if let Some(keeper) = &self.keeper {
            if keeper.release(lease, true).await {
                return;
            }
        }
        self.release_each(std::slice::from_ref(lease)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::next_attempt;

    /// A batch larger than an attempt goes in attempts of at most `most`, each the earliest due claims
    /// in their order, until every claim has gone once; what is not due yet waits for its time.
    #[test]
    fn a_large_batch_goes_in_bounded_attempts_in_order() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        // 300 claims due now, and 5 not due yet among them.
        let mut pending: Vec<(usize, Instant)> = (0..305)
            .map(|i| (i, if i % 61 == 60 { later } else { now }))
            .collect();
        let mut attempts = Vec::new();
        loop {
            let (ready, rest) = next_attempt(pending, |p| p.1, now, 128);
            pending = rest;
            if ready.is_empty() {
                break;
            }
            attempts.push(ready.into_iter().map(|p| p.0).collect::<Vec<_>>());
        }
        let sizes: Vec<usize> = attempts.iter().map(Vec::len).collect();
        assert_eq!(sizes, [128, 128, 44]);
        let sent: Vec<usize> = attempts.concat();
        let due: Vec<usize> = (0..305).filter(|i| i % 61 != 60).collect();
        assert_eq!(sent, due, "every due claim once, in order");
        let waiting: Vec<usize> = pending.iter().map(|p| p.0).collect();
        assert_eq!(waiting, [60, 121, 182, 243, 304]);
        let (ready, rest) = next_attempt(pending, |p| p.1, later, 128);
        assert_eq!((ready.len(), rest.len()), (5, 0));
    }
}
