//! The Redlock store on N independent Redis nodes.
//!
//! A claim of `(job, tick)` takes two rounds, each sent to every node in parallel as one pipeline that
//! carries all the claims due at that instant:
//!
//! 1. [`scripts::ACQUIRE`]: take the lease unless the tick is claimed or the lease is held; learn each
//!    node's fence counter. A majority of `ok` answers lets the claim go on, with the fencing token
//!    `max(highest fence seen + 1, token_floor(tick))`.
//! 2. [`scripts::CONFIRM`]: on each node where our lease value still holds, raise the fence counter to the
//!    token and record the tick as claimed. The claim is granted only when a majority confirms before the
//!    lease's validity (`ttl − elapsed − drift`, measured on the monotonic clock from before round 1) ends.
//!
//! Every round returns as soon as its outcome is known — a majority agreed, or a majority can no longer
//! agree — and never waits for a slow or hung node longer than `node_timeout`. The safety argument is in
//! `docs/protocol.md`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use redis::{Pipeline, Value};
use tokio::time::Instant;

use super::node::Node;
use super::quorum::{quorum, Decision, Tally, Vote};
use super::{
    scripts, validity, ClaimOutcome, ClaimRequest, FencingToken, Lease, LockSettings, Overlap,
    QuorumFailure, RenewError, StoreError,
};
use crate::schedule::Tick;

/// Leases, claims and fencing tokens on a majority of N independent Redis nodes.
pub struct RedisStore {
    settings: LockSettings,
    nodes: Arc<Vec<Node>>,
}

/// The lowest token a lease of `tick` may carry: the tick in milliseconds × 1000.
///
/// Tokens of later ticks therefore start above every token a job can have reached at an earlier tick
/// (it would take 1000 confirmed attempts within one millisecond of schedule to catch up), which keeps
/// tokens increasing even if a node forgets its fence counter. Below 2^53 (exact in Lua) until the year
/// 2255.
pub fn token_floor(tick: Tick) -> FencingToken {
    u64::try_from(tick.as_millis())
        .unwrap_or(0)
        .saturating_mul(1000)
}

/// The three keys of one claim on every node: lease, fence counter, tick claim.
pub(crate) fn claim_keys(prefix: &str, job: &str, tick: Tick, overlap: Overlap) -> [String; 3] {
    let lease = match overlap {
        Overlap::Skip => format!("{prefix}:{{{job}}}:lease"),
        Overlap::Allow => format!("{prefix}:{{{job}}}:lease:{}", tick.as_millis()),
    };
    [
        lease,
        format!("{prefix}:{{{job}}}:fence"),
        format!("{prefix}:{{{job}}}:claim"),
    ]
}

/// What one node answered to round 1 of one claim.
#[derive(Debug)]
enum Round1 {
    Ok { fence: u64 },
    Claimed,
    Busy { holder: String, pttl_ms: i64 },
    Failed(String),
}

/// One request in one attempt.
struct Try<'a> {
    request: &'a ClaimRequest,
    /// The value kept from the previous attempt (we led a split vote), or `None` for a fresh one.
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
    /// The outcome is final (the tick is taken, or too many nodes failed).
    No,
    /// A split vote that another contender leads: undo, and retry after the delay plus jitter.
    Later,
    /// A split vote that we lead: keep our keys (this value) and retry soon.
    Soon(String),
}

impl RedisStore {
    /// Prepares the store; connections open in the background and re-open by themselves.
    ///
    /// Must be called inside a Tokio runtime. Fails only on URLs that cannot name a Redis node.
    pub fn new(urls: &[String], settings: LockSettings) -> Result<RedisStore, StoreError> {
        if urls.is_empty() {
            return Err(StoreError::NoNodes(0));
        }
        // `rediss://` nodes need a TLS crypto provider; rustls no longer picks one by itself. Installing
        // fails only if one is already installed, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let nodes = urls
            .iter()
            .map(|url| Node::new(url, settings.node_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        nodes.iter().for_each(Node::warm_up);
        Ok(RedisStore {
            settings,
            nodes: Arc::new(nodes),
        })
    }

    /// The nodes' addresses, without passwords.
    pub fn node_labels(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.label.clone()).collect()
    }

    /// The lock settings this store was built with.
    pub fn settings(&self) -> &LockSettings {
        &self.settings
    }

    /// Claims every request, retrying split votes; see [`super::LockStore::claim_many`].
    ///
    /// A split vote (no holder with a majority) is broken in two ways. The contender with the most votes
    /// (ties to the smallest value, which every contender sees alike) keeps its keys and retries soon, so
    /// it picks up the nodes the others free; the others undo and retry after `retry_delay` plus random
    /// jitter, by which time they usually find the leader holding a majority and stop.
    pub async fn claim_many(
        &self,
        worker_id: &str,
        requests: &[ClaimRequest],
    ) -> Vec<ClaimOutcome> {
        let mut outcomes: Vec<Option<ClaimOutcome>> = requests.iter().map(|_| None).collect();
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
            tokio::time::sleep_until(ready_at).await;
            let now = Instant::now();
            let (ready, waiting): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.1 <= now);
            pending = waiting;
            let batch: Vec<Try<'_>> = ready
                .iter()
                .map(|(index, _, left, value)| Try {
                    request: &requests[*index],
                    value: value.clone(),
                    may_keep: *left > 0,
                })
                .collect();
            let results = self.attempt(worker_id, &batch).await;
            for ((index, _, left, _), result) in ready.into_iter().zip(results) {
                let base = self.settings.retry_delay;
                match result {
                    Attempt::Won(lease) => outcomes[index] = Some(ClaimOutcome::Won(lease)),
                    Attempt::Lost {
                        retry: Retry::Soon(value),
                        ..
                    } if left > 0 => {
                        pending.push((index, Instant::now() + base / 4, left - 1, Some(value)));
                    }
                    Attempt::Lost {
                        retry: Retry::Later,
                        ..
                    } if left > 0 => {
                        // Random jitter breaks the symmetry between the contenders that lost the vote.
                        let jitter = base.mul_f64(rand::rng().random::<f64>());
                        pending.push((index, Instant::now() + base + jitter, left - 1, None));
                    }
                    Attempt::Lost { outcome, .. } => outcomes[index] = Some(outcome),
                }
            }
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(ClaimOutcome::AlreadyClaimed))
            .collect()
    }

    /// One attempt at every request of the batch: round 1, then round 2 for those that reached a majority.
    async fn attempt(&self, worker_id: &str, tries: &[Try<'_>]) -> Vec<Attempt> {
        let settings = &self.settings;
        let ttl_ms = settings.ttl.as_millis().to_string();
        let requests: Vec<&ClaimRequest> = tries.iter().map(|t| t.request).collect();
        let values: Vec<String> = tries
            .iter()
            .map(|t| {
                t.value
                    .clone()
                    .unwrap_or_else(|| format!("{worker_id}/{}", uuid::Uuid::new_v4()))
            })
            .collect();
        let keys: Vec<[String; 3]> = requests
            .iter()
            .map(|r| claim_keys(&settings.key_prefix, &r.job, r.tick, r.overlap))
            .collect();

        // The stopwatch starts before the first SET can reach any node, so the validity computed from it
        // never outlives the keys.
        let start = Instant::now();
        let mut pipeline = redis::pipe();
        for ((request, keys), value) in requests.iter().zip(&keys).zip(&values) {
            pipeline.add_command(evalsha(
                &scripts::ACQUIRE,
                keys,
                &[value, &ttl_ms, &request.tick.as_millis().to_string()],
            ));
        }
        let answers = self.round(
            &pipeline,
            settings.node_timeout,
            parse_round1,
            Round1::Failed,
            |answer| match answer {
                Round1::Ok { .. } => Vote::Granted,
                Round1::Failed(why) => Vote::Failed(why.clone()),
                Round1::Claimed | Round1::Busy { .. } => Vote::Refused,
            },
        );
        let answers = answers.await;

        // Round 2 for the requests that reached a majority, while their validity lasts.
        let drift = validity::drift(settings.ttl, settings.drift_factor);
        let deadline = start + settings.ttl.saturating_sub(drift);
        let mut results: Vec<Option<Attempt>> = requests.iter().map(|_| None).collect();
        let mut confirming = Vec::new();
        for (index, node_answers) in answers.iter().enumerate() {
            let granted = node_answers
                .iter()
                .filter(|(_, a)| matches!(a, Round1::Ok { .. }))
                .count();
            if granted >= quorum(self.nodes.len())
                && validity::validity(settings.ttl, start.elapsed(), settings.drift_factor)
                    .is_some()
            {
                let highest = node_answers
                    .iter()
                    .filter_map(|(_, a)| match a {
                        Round1::Ok { fence } => Some(*fence),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0);
                let token = highest
                    .saturating_add(1)
                    .max(token_floor(requests[index].tick));
                confirming.push((index, token));
            } else {
                results[index] =
                    Some(self.lost_in_round1(node_answers, &values[index], tries[index].may_keep));
            }
        }
        if !confirming.is_empty() {
            let mut pipeline = redis::pipe();
            for &(index, token) in &confirming {
                let tick = requests[index].tick.as_millis().to_string();
                pipeline.add_command(evalsha(
                    &scripts::CONFIRM,
                    &keys[index],
                    &[&values[index], &token.to_string(), &tick],
                ));
            }
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .min(settings.node_timeout);
            let confirmed = self
                .round(
                    &pipeline,
                    budget,
                    parse_status,
                    Err,
                    |answer| match answer.as_deref() {
                        Ok("ok") => Vote::Granted,
                        Ok(_) => Vote::Refused,
                        Err(why) => Vote::Failed(why.clone()),
                    },
                )
                .await;
            for ((index, token), node_answers) in confirming.into_iter().zip(confirmed) {
                let granted = node_answers
                    .iter()
                    .filter(|(_, a)| a.as_deref() == Ok("ok"))
                    .count();
                results[index] = Some(
                    if granted >= quorum(self.nodes.len()) && Instant::now() < deadline {
                        Attempt::Won(Lease::new(
                            requests[index],
                            token,
                            values[index].clone(),
                            deadline,
                        ))
                    } else {
                        self.lost_in_round2(&node_answers, granted)
                    },
                );
            }
        }

        // Undo every attempt that was not granted, on every node (also those that did not answer in time
        // and may still apply our SET): compare-and-delete touches only our own value.
        let mut undo = redis::pipe();
        let mut any = false;
        for (index, result) in results.iter().enumerate() {
            if !matches!(
                result,
                Some(Attempt::Won(_))
                    | Some(Attempt::Lost {
                        retry: Retry::Soon(_),
                        ..
                    })
            ) {
                undo.add_command(evalsha(
                    &scripts::RELEASE,
                    &keys[index][..1],
                    &[&values[index]],
                ));
                any = true;
            }
        }
        if any {
            self.spawn_everywhere(undo);
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or(Attempt::Lost {
                    outcome: ClaimOutcome::AlreadyClaimed,
                    retry: Retry::No,
                })
            })
            .collect()
    }

    /// Classifies a request that could not reach a majority in round 1.
    fn lost_in_round1(&self, answers: &[(usize, Round1)], ours: &str, may_keep: bool) -> Attempt {
        let needed = quorum(self.nodes.len());
        let claimed = answers
            .iter()
            .filter(|(_, a)| matches!(a, Round1::Claimed))
            .count();
        let mut holders: HashMap<&str, (usize, i64)> = HashMap::new();
        for (_, answer) in answers {
            if let Round1::Busy { holder, pttl_ms } = answer {
                let entry = holders.entry(holder.as_str()).or_insert((0, *pttl_ms));
                entry.0 += 1;
            }
        }
        let busy: usize = holders.values().map(|(count, _)| count).sum();
        let top = holders
            .iter()
            .max_by_key(|(_, (count, _))| *count)
            .map(|(h, (c, ttl))| (*h, *c, *ttl));
        let busy_outcome = |(holder, _, pttl): (&str, usize, i64)| ClaimOutcome::Busy {
            holder: Some(
                holder
                    .rsplit_once('/')
                    .map_or(holder, |(worker, _)| worker)
                    .to_string(),
            ),
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        };
        if claimed > 0 && claimed + busy >= needed {
            // Someone confirmed this tick (or a later one) on a node, and the rest are held: it is taken.
            return Attempt::Lost {
                outcome: ClaimOutcome::AlreadyClaimed,
                retry: Retry::No,
            };
        }
        if let Some(top) = top {
            if top.1 + claimed >= needed {
                // Another holder has a majority but has not confirmed our tick (a node answers `busy`
                // only while its claim is below our tick). It is either a contender between its two
                // rounds — which may still fail — or the previous run holding the job. Looking again
                // after the delay tells which: `claimed`, a free lease, or `busy` once more.
                return Attempt::Lost {
                    outcome: busy_outcome(top),
                    retry: Retry::Later,
                };
            }
            // A split vote. The leader is the value with the most nodes, ties to the smallest value:
            // every contender sees the same holders on the same nodes, so they agree on the leader.
            let granted = answers
                .iter()
                .filter(|(_, a)| matches!(a, Round1::Ok { .. }))
                .count();
            let leads = holders.iter().all(|(holder, (count, _))| {
                granted > *count || (granted == *count && ours < *holder)
            });
            let retry = if leads && may_keep {
                Retry::Soon(ours.to_string())
            } else {
                Retry::Later
            };
            return Attempt::Lost {
                outcome: busy_outcome(top),
                retry,
            };
        }
        let failure = self.quorum_failure(
            answers.iter().filter_map(|(node, a)| match a {
                Round1::Failed(why) => Some((*node, why.clone())),
                _ => None,
            }),
            answers
                .iter()
                .filter(|(_, a)| matches!(a, Round1::Ok { .. }))
                .count(),
            answers.iter().map(|(node, _)| *node),
        );
        if claimed > 0 {
            return Attempt::Lost {
                outcome: ClaimOutcome::AlreadyClaimed,
                retry: Retry::No,
            };
        }
        // Too many nodes failed: retrying within this tick would only add the same timeouts again.
        Attempt::Lost {
            outcome: ClaimOutcome::NoQuorum(failure),
            retry: Retry::No,
        }
    }

    /// Classifies a request that reached a majority in round 1 but not in round 2.
    fn lost_in_round2(
        &self,
        answers: &[(usize, Result<String, String>)],
        granted: usize,
    ) -> Attempt {
        if answers.iter().any(|(_, a)| a.as_deref() == Ok("claimed")) {
            return Attempt::Lost {
                outcome: ClaimOutcome::AlreadyClaimed,
                retry: Retry::No,
            };
        }
        let failures = answers.iter().filter_map(|(node, answer)| match answer {
            Ok(status) if status == "ok" => None,
            Ok(status) => Some((*node, format!("lease {status} before confirmation"))),
            Err(why) => Some((*node, why.clone())),
        });
        let failure = self.quorum_failure(failures, granted, answers.iter().map(|(node, _)| *node));
        Attempt::Lost {
            outcome: ClaimOutcome::NoQuorum(failure),
            retry: Retry::Later,
        }
    }

    /// A [`QuorumFailure`] naming each failed node, and each node that had not answered (`answered` lists
    /// those that had) when the round was decided.
    fn quorum_failure(
        &self,
        failed: impl Iterator<Item = (usize, String)>,
        granted: usize,
        answered: impl Iterator<Item = usize>,
    ) -> QuorumFailure {
        let mut failures: Vec<(usize, String)> = failed.collect();
        let answered: std::collections::HashSet<usize> = answered.collect();
        for node in (0..self.nodes.len()).filter(|node| !answered.contains(node)) {
            failures.push((node, "no answer yet when the round was decided".to_string()));
        }
        failures.sort_by_key(|(node, _)| *node);
        QuorumFailure {
            configured: self.nodes.len(),
            needed: quorum(self.nodes.len()),
            granted,
            failures: failures
                .into_iter()
                .map(|(node, why)| (self.nodes[node].label.clone(), why))
                .collect(),
        }
    }

    /// A plain Redlock lease on `resource`: `SET NX PX` on every node, no tick claim and no fencing token
    /// (the lease's token is 0). One round trip; the lease renews and releases like a claimed one.
    ///
    /// For callers that need mutual exclusion only; the worker always claims ticks with
    /// [`RedisStore::claim_many`].
    pub async fn acquire_lease(&self, worker_id: &str, resource: &str) -> ClaimOutcome {
        let request = ClaimRequest {
            job: resource.to_string(),
            tick: Tick(0),
            overlap: Overlap::Skip,
        };
        let [key, _, _] = claim_keys(
            &self.settings.key_prefix,
            resource,
            request.tick,
            request.overlap,
        );
        let value = format!("{worker_id}/{}", uuid::Uuid::new_v4());
        let start = Instant::now();
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
                &pipeline,
                self.settings.node_timeout,
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
        let mut undo = redis::pipe();
        undo.add_command(evalsha(&scripts::RELEASE, &[key], &[&value]));
        self.spawn_everywhere(undo);
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

    /// Extends the lease if a majority still holds it, before its deadline; see [`super::LockStore::renew`].
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        if lease.is_lost() {
            return Err(RenewError::AlreadyLost);
        }
        let start = Instant::now();
        if start >= lease.deadline() {
            lease.mark_lost();
            return Err(RenewError::Expired);
        }
        let settings = &self.settings;
        let [key, _, _] = claim_keys(&settings.key_prefix, &lease.job, lease.tick, lease.overlap);
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(
            &scripts::RENEW,
            &[key],
            &[&lease.value, &settings.ttl.as_millis().to_string()],
        ));
        // The round must be decided inside the remaining validity: a renewal confirmed after the deadline
        // proves nothing about the time in between, when another holder may have taken the lease.
        let budget = lease
            .deadline()
            .saturating_duration_since(start)
            .min(settings.node_timeout);
        let answers = self
            .round(
                &pipeline,
                budget,
                parse_integer,
                Err,
                |answer| match answer {
                    Ok(1) => Vote::Granted,
                    Ok(_) => Vote::Refused,
                    Err(why) => Vote::Failed(why.clone()),
                },
            )
            .await;
        let answers = answers.into_iter().next().unwrap_or_default();
        let granted = answers.iter().filter(|(_, a)| a == &Ok(1)).count();
        let refused = answers
            .iter()
            .filter(|(_, a)| matches!(a, Ok(n) if *n != 1))
            .count();
        let needed = quorum(self.nodes.len());
        if granted >= needed {
            if Instant::now() >= lease.deadline() {
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
        if refused > self.nodes.len() - needed || Instant::now() >= lease.deadline() {
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

    /// Compare-and-delete on every node; waits at most `node_timeout` for the answers.
    pub async fn release(&self, lease: &Lease) {
        let [key, _, _] = claim_keys(
            &self.settings.key_prefix,
            &lease.job,
            lease.tick,
            lease.overlap,
        );
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(&scripts::RELEASE, &[key], &[&lease.value]));
        let timeout = self.settings.node_timeout;
        let mut all: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| node.eval(&pipeline, timeout))
            .collect();
        while all.next().await.is_some() {}
    }

    /// Sends `pipeline` to every node in the background, bounded by the TTL (after which the keys it
    /// would delete have expired anyway).
    fn spawn_everywhere(&self, pipeline: Pipeline) {
        let nodes = Arc::clone(&self.nodes);
        let timeout = self.settings.ttl;
        tokio::spawn(async move {
            let mut all: FuturesUnordered<_> = nodes
                .iter()
                .map(|node| node.eval(&pipeline, timeout))
                .collect();
            while all.next().await.is_some() {}
        });
    }

    /// Sends one pipeline to every node in parallel and collects, per command, each node's parsed answer,
    /// until every command's outcome is decided or `budget` has passed.
    ///
    /// Returns, for each command of the pipeline, the answers as `(node index, answer)`; nodes that had not
    /// answered when the round was decided are absent.
    async fn round<A>(
        &self,
        pipeline: &Pipeline,
        budget: Duration,
        parse: fn(Value) -> A,
        failed: fn(String) -> A,
        vote: impl Fn(&A) -> Vote,
    ) -> Vec<Vec<(usize, A)>> {
        let commands = pipeline.cmd_iter().count();
        let mut answers: Vec<Vec<(usize, A)>> = (0..commands).map(|_| Vec::new()).collect();
        let mut tallies: Vec<Tally> = (0..commands)
            .map(|_| Tally::new(self.nodes.len()))
            .collect();
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| async move { (index, node.eval(pipeline, budget).await) })
            .collect();
        while let Some((node, result)) = pending.next().await {
            match result {
                Ok(values) if values.len() == commands => {
                    for (command, value) in values.into_iter().enumerate() {
                        let answer = parse(value);
                        tallies[command].add(&vote(&answer));
                        answers[command].push((node, answer));
                    }
                }
                Ok(values) => {
                    let why = format!("answered {} results for {commands} commands", values.len());
                    record_failure(&mut answers, &mut tallies, node, &why, failed, &vote);
                }
                Err(why) => record_failure(&mut answers, &mut tallies, node, &why, failed, &vote),
            }
            if tallies
                .iter()
                .all(|tally| tally.decision() != Decision::Pending)
            {
                break;
            }
        }
        answers
    }
}

/// Counts a node's failure against every command of the round.
fn record_failure<A>(
    answers: &mut [Vec<(usize, A)>],
    tallies: &mut [Tally],
    node: usize,
    why: &str,
    failed: fn(String) -> A,
    vote: &impl Fn(&A) -> Vote,
) {
    for (command, tally) in tallies.iter_mut().enumerate() {
        let answer = failed(why.to_string());
        tally.add(&vote(&answer));
        answers[command].push((node, answer));
    }
}

/// An `EVALSHA` of `script` (the node loads it after a `NOSCRIPT`; see [`Node::eval`]).
fn evalsha(script: &redis::Script, keys: &[String], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
}

/// A bulk or simple string, or an integer, as text.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn server_error(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(error) => Some(format!("{error:?}")),
        _ => None,
    }
}

/// Parses round 1's `{"ok", fence}` / `{"claimed", claim}` / `{"busy", holder, pttl}`.
fn parse_round1(value: Value) -> Round1 {
    if let Some(error) = server_error(&value) {
        return Round1::Failed(error);
    }
    let Value::Array(items) = value else {
        return Round1::Failed(format!("unexpected reply {value:?}"));
    };
    let fields: Vec<String> = items.iter().filter_map(text).collect();
    match fields.as_slice() {
        [status, fence] if status == "ok" => match fence.parse() {
            Ok(fence) => Round1::Ok { fence },
            Err(_) => Round1::Failed(format!("bad fence counter {fence:?}")),
        },
        [status, _] if status == "claimed" => Round1::Claimed,
        [status, holder, pttl] if status == "busy" => Round1::Busy {
            holder: holder.clone(),
            pttl_ms: pttl.parse().unwrap_or(-1),
        },
        _ => Round1::Failed(format!("unexpected reply {fields:?}")),
    }
}

/// Parses a status string (`"ok"`, `"lost"`, `"claimed"`).
fn parse_status(value: Value) -> Result<String, String> {
    if let Some(error) = server_error(&value) {
        return Err(error);
    }
    text(&value).ok_or_else(|| format!("unexpected reply {value:?}"))
}

/// Parses the reply to `SET … NX`: `OK` when set, nil when the key exists.
fn parse_set(value: Value) -> Result<bool, String> {
    match value {
        Value::Okay => Ok(true),
        Value::Nil => Ok(false),
        other => {
            server_error(&other).map_or_else(|| Err(format!("unexpected reply {other:?}")), Err)
        }
    }
}

/// Parses an integer reply.
fn parse_integer(value: Value) -> Result<i64, String> {
    if let Some(error) = server_error(&value) {
        return Err(error);
    }
    match value {
        Value::Int(n) => Ok(n),
        other => Err(format!("unexpected reply {other:?}")),
    }
}
