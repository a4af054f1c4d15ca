//! One attempt at a batch of claims: the two rounds, and what an attempt that was not granted means.

use std::collections::BTreeMap;
use std::time::Duration;

use super::reply::{parse_round1, parse_round2, Round1, Round2};
use super::scripts::{self, Calls};
use super::{Attempt, RedisStore, Retry, Try};
use crate::clock::boot::BootInstant;
use crate::lock::keys::{attempt_value, claim_keys, next_token, Holder};
use crate::lock::quorum::{quorum, Vote};
use crate::lock::{
    validity, ClaimOutcome, ClaimRequest, FencingToken, Lease, Pause, QuorumFailure, Refusal,
};

/// One try as the scripts take it: its request, the lease value of this attempt (a fresh one, or the
/// value a split vote's leader keeps), its four keys, and its tick and window as the scripts' arguments.
struct Prepared<'a> {
    request: &'a ClaimRequest,
    value: String,
    keys: [String; 4],
    /// The tick in milliseconds.
    tick: String,
    /// The window's end of a one-off claim (`0`: none).
    not_after: String,
    /// When a one-off claim's record expires (`0`: never).
    expires: String,
}

impl<'a> Prepared<'a> {
    fn of(t: &Try<'a>, prefix: &str) -> Prepared<'a> {
        let r = t.request;
        Prepared {
            request: r,
            value: t
                .value
                .clone()
                .unwrap_or_else(|| attempt_value(&r.claimant, r.tick, &r.fingerprint, &r.series)),
            keys: claim_keys(prefix, &r.job, r.tick, r.overlap, &r.series),
            tick: r.tick.as_millis().to_string(),
            not_after: r.not_after.map_or(0, |t| t.as_millis()).to_string(),
            expires: r.record_expires_at().unwrap_or(0).to_string(),
        }
    }
}

impl RedisStore {
    /// One attempt at every request of the batch: round 1, then round 2 for those that reached a majority.
    pub(super) async fn attempt(&self, tries: &[Try<'_>]) -> Vec<Attempt> {
        let prefix = &self.settings.key_prefix;
        let prepared: Vec<Prepared> = tries.iter().map(|t| Prepared::of(t, prefix)).collect();
        // The stopwatch starts before the first SET can reach any node, so the validity computed from it
        // never outlives the keys.
        let start = BootInstant::now();
        let answers = self.acquire_round(&prepared).await;
        let mut results: Vec<Option<Attempt>> = tries.iter().map(|_| None).collect();
        let confirming = self.after_round1(tries, &prepared, &answers, start, &mut results);
        if !confirming.is_empty() {
            let drift = validity::drift(self.settings.ttl, self.settings.drift_factor);
            let deadline = start + self.settings.ttl.saturating_sub(drift);
            self.confirm_round(&prepared, confirming, deadline, &mut results)
                .await;
        }
        self.undo_not_granted(tries, &prepared, &answers, &results);
        // Every request was decided above; were one not, it would be unanswered (retried), never taken
        // for claimed.
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Attempt::Lost {
                    outcome: ClaimOutcome::unanswered(self.nodes.len()),
                    retry: Retry::No,
                })
            })
            .collect()
    }

    /// Round 1 (`ACQUIRE`) of every prepared request on every node.
    async fn acquire_round(&self, prepared: &[Prepared<'_>]) -> Vec<Vec<(usize, Round1)>> {
        let ttl_ms = self.settings.ttl.as_millis().to_string();
        let round1 = Calls::new(
            &scripts::ACQUIRE,
            prepared.iter().map(|p| {
                let args = [
                    p.value.as_str(),
                    &ttl_ms,
                    &p.tick,
                    &p.request.claimant,
                    &p.not_after,
                ];
                (&p.keys, args)
            }),
            self.per_slot,
        );
        self.round(
            round1.for_round(),
            batch_budget(self.settings.node_timeout, prepared.len()),
            // Room for the confirming round and the run's start within the validity.
            self.settings.ttl / 4,
            parse_round1,
            Round1::Failed,
            |answer| match answer {
                Round1::Ok { .. } => Vote::Granted,
                Round1::Failed(why) => Vote::Failed(why.clone()),
                Round1::Claimed(_)
                | Round1::Busy { .. }
                | Round1::Paused(_)
                | Round1::Ahead { .. } => Vote::Refused,
            },
        )
        .await
    }

    /// What round 1 (begun at `start`) decided: the requests that reached a majority in time go on to
    /// round 2 with their token (returned, by index); the others' results are set here.
    fn after_round1(
        &self,
        tries: &[Try<'_>],
        prepared: &[Prepared<'_>],
        answers: &[Vec<(usize, Round1)>],
        start: BootInstant,
        results: &mut [Option<Attempt>],
    ) -> Vec<(usize, FencingToken)> {
        let settings = &self.settings;
        let mut confirming = Vec::new();
        for (index, node_answers) in answers.iter().enumerate() {
            let fences = node_answers.iter().filter_map(|(_, a)| match a {
                Round1::Ok { fence } => Some(*fence),
                _ => None,
            });
            let granted = fences.clone().count();
            let in_time =
                validity::validity(settings.ttl, start.elapsed(), settings.drift_factor).is_some();
            if granted >= quorum(self.nodes.len()) && in_time {
                // Exact, and refused past the bound rather than saturated: a token that stood still
                // would be handed out twice.
                match next_token(fences.max().unwrap_or(0), prepared[index].request.tick) {
                    Ok(token) => confirming.push((index, token)),
                    Err(refusal) => {
                        results[index] = Some(Attempt::Lost {
                            outcome: ClaimOutcome::Refused(refusal),
                            retry: Retry::No,
                        });
                    }
                }
            } else {
                results[index] = Some(self.lost_in_round1(
                    node_answers,
                    &tries[index],
                    &prepared[index].value,
                    tries.len(),
                ));
            }
        }
        confirming
    }

    /// Round 2 (`CONFIRM`) of the requests in `confirming` with their tokens: each is won if a majority
    /// confirmed it before `deadline`, and lost as round 2 says otherwise.
    async fn confirm_round(
        &self,
        prepared: &[Prepared<'_>],
        confirming: Vec<(usize, FencingToken)>,
        deadline: BootInstant,
        results: &mut [Option<Attempt>],
    ) {
        let tokens: Vec<String> = confirming.iter().map(|(_, t)| t.to_string()).collect();
        let round2 = Calls::new(
            &scripts::CONFIRM,
            confirming.iter().zip(&tokens).map(|(&(index, _), token)| {
                let p = &prepared[index];
                let args = [
                    p.value.as_str(),
                    token,
                    &p.tick,
                    &p.request.claimant,
                    &p.not_after,
                    &p.expires,
                ];
                (&p.keys, args)
            }),
            self.per_slot,
        );
        let confirmed = self
            .round(
                round2.for_round(),
                batch_budget(self.settings.node_timeout, confirming.len()),
                deadline.remaining(),
                parse_round2,
                Round2::Failed,
                |answer| match answer {
                    Round2::Ok => Vote::Granted,
                    Round2::Lost | Round2::Claimed(_) | Round2::Paused(_) => Vote::Refused,
                    Round2::Failed(why) => Vote::Failed(why.clone()),
                },
            )
            .await;
        for ((index, token), node_answers) in confirming.into_iter().zip(confirmed) {
            let granted = node_answers
                .iter()
                .filter(|(_, a)| matches!(a, Round2::Ok))
                .count();
            let p = &prepared[index];
            results[index] = Some(
                if granted >= quorum(self.nodes.len()) && BootInstant::now() < deadline {
                    Attempt::Won(Lease::new(p.request, token, p.value.clone(), deadline))
                } else {
                    self.lost_in_round2(&node_answers, granted)
                },
            );
        }
    }

    /// Undoes every attempt that was not granted, in the background, on every node that may hold its
    /// SET: compare-and-delete touches only this attempt's value, so it can never delete a later attempt
    /// of the same claimant. A claim record this attempt confirmed stays: it is ours, and a retry of the
    /// same request goes on from it. See [`may_hold_our_set`] for the nodes that are spared. One batch of
    /// releases per node, the attempts it may hold.
    fn undo_not_granted(
        &self,
        tries: &[Try<'_>],
        prepared: &[Prepared<'_>],
        answers: &[Vec<(usize, Round1)>],
        results: &[Option<Attempt>],
    ) {
        let mut undo: Vec<Vec<usize>> = self.nodes.iter().map(|_| Vec::new()).collect();
        for (index, result) in results.iter().enumerate() {
            if matches!(
                result,
                Some(Attempt::Won(_))
                    | Some(Attempt::Lost {
                        retry: Retry::Soon(_),
                        ..
                    })
            ) {
                continue;
            }
            let fresh = tries[index].value.is_none();
            for (node, undone) in undo.iter_mut().enumerate() {
                let answer = answers[index].iter().find(|(n, _)| *n == node);
                if may_hold_our_set(answer.map(|(_, a)| a), fresh) {
                    undone.push(index);
                }
            }
        }
        let undo = undo
            .into_iter()
            .map(|undone| {
                let leases = undone.into_iter().map(|index| {
                    let p = &prepared[index];
                    (&p.keys[..1], [p.value.as_str()])
                });
                Calls::new(&scripts::RELEASE, leases, self.per_slot).pipeline
            })
            .collect();
        self.spawn_on_each(undo);
    }

    /// Classifies a request that could not go on to round 2.
    ///
    /// Only what is certain is final: the tick is taken when so many nodes answered `claimed` that no
    /// majority is left for us, the job is paused when the pause (with claims) leaves none, and the job is
    /// busy when another tick's run holds it on the rest. `claimed`
    /// answers from fewer nodes are leftovers of an attempt that may never have been granted (a contender
    /// that crashed during its round 2): they do not make the tick taken. A contender of the same tick
    /// holding the lease is waited out: it confirms, gives up, or its lease expires. `batch` is the number
    /// of requests in this attempt.
    fn lost_in_round1(
        &self,
        answers: &[(usize, Round1)],
        attempt: &Try<'_>,
        ours: &str,
        batch: usize,
    ) -> Attempt {
        let configured = self.nodes.len();
        let spare = configured - quorum(configured);
        let (tick, series) = (attempt.request.tick, &attempt.request.series);
        let mut claimed: Vec<Option<&Holder>> = Vec::new();
        let mut paused: Vec<&Pause> = Vec::new();
        // value → (nodes, smallest pttl) for same-tick contenders, and the other ticks' holders.
        let mut contenders: BTreeMap<&str, (usize, i64)> = BTreeMap::new();
        let mut others: Vec<(Holder, i64)> = Vec::new();
        let mut ahead: Vec<i64> = Vec::new();
        // What each node that refused said, for a failure with too few refusals to decide by.
        let mut refusals: Vec<(usize, String)> = Vec::new();
        for (node, answer) in answers {
            if let Some(said) = refusal(answer) {
                refusals.push((*node, said));
            }
            match answer {
                Round1::Claimed(by) => claimed.push(by.as_ref()),
                Round1::Paused(pause) => paused.push(pause),
                Round1::Ahead { node_ms } => ahead.push(*node_ms),
                Round1::Busy { value, pttl_ms } => {
                    let holder = Holder::from_value(value);
                    if holder.contends_for(tick, series) {
                        let entry = contenders.entry(value.as_str()).or_insert((0, *pttl_ms));
                        entry.0 += 1;
                        entry.1 = entry.1.min(*pttl_ms);
                    } else {
                        others.push((holder, *pttl_ms));
                    }
                }
                Round1::Ok { .. } | Round1::Failed(_) => {}
            }
        }
        if claimed.len() > spare {
            let by = claimed.into_iter().flatten().next().cloned();
            return Attempt::Lost {
                outcome: ClaimOutcome::AlreadyClaimed { by },
                retry: Retry::No,
            };
        }
        let paused_outcome = || Attempt::Lost {
            outcome: ClaimOutcome::Paused(paused[0].clone()),
            retry: Retry::No,
        };
        if paused.len() > spare {
            return paused_outcome();
        }
        if !others.is_empty() && others.len() + claimed.len() + paused.len() > spare {
            let (holder, pttl) = others.swap_remove(0);
            return Attempt::Lost {
                outcome: ClaimOutcome::Busy {
                    holder: Some(holder),
                    ttl: pttl_duration(pttl),
                },
                retry: Retry::No,
            };
        }
        // Paused on some nodes and claimed on the others that refused (leftovers, or a pause under way):
        // no majority is left for us, and the pause is what the operator asked for.
        if !paused.is_empty() && paused.len() + claimed.len() > spare {
            return paused_outcome();
        }
        // The tick is far ahead of the clocks of nodes that, with the other refusals, leave no majority:
        // refused for as long as those clocks do not move by an hour.
        if !ahead.is_empty() && ahead.len() + claimed.len() + paused.len() + others.len() > spare {
            return Attempt::Lost {
                outcome: ClaimOutcome::Refused(Refusal::TickAhead {
                    tick,
                    store_ms: ahead[0],
                }),
                retry: Retry::No,
            };
        }
        let granted = answers
            .iter()
            .filter(|(_, a)| matches!(a, Round1::Ok { .. }))
            .count();
        // The leading contender: the value with the most nodes, ties to the smallest value (a BTreeMap
        // iterates in value order and `max_by_key` keeps the last maximum, hence the reversal).
        if let Some((&top, &(count, pttl))) =
            contenders.iter().rev().max_by_key(|(_, (count, _))| *count)
        {
            let holder = Some(Holder::from_value(top));
            if count >= quorum(configured) {
                // It holds a majority: it is between its rounds (and confirms in a moment, which we then see
                // as `claimed`), or it crashed there (and its lease expires). Look again after the delay,
                // and once our tries are spent, tell the caller when its lease frees the first node.
                let retry_in = pttl_duration(pttl)
                    .unwrap_or(self.settings.retry_delay)
                    .max(self.settings.retry_delay);
                return Attempt::Lost {
                    outcome: ClaimOutcome::Contended { holder, retry_in },
                    retry: Retry::Later,
                };
            }
            // A split vote. Every contender sees the same holders on the same nodes, so they agree on the
            // leader, which keeps its keys and retries soon while the others undo and keep away until it
            // has had its next round.
            let leads = contenders.iter().all(|(value, (count, _))| {
                granted > *count || (granted == *count && ours < *value)
            });
            let (retry, retry_in) = match (leads, attempt.may_keep) {
                (true, true) => (Retry::Soon(ours.to_string()), self.settings.retry_delay),
                (true, false) => (Retry::Later, self.settings.retry_delay),
                (false, _) => (Retry::Yield, self.yield_delay(batch)),
            };
            return Attempt::Lost {
                outcome: ClaimOutcome::Contended { holder, retry_in },
                retry,
            };
        }
        let failed: Vec<(usize, String)> = answers
            .iter()
            .filter_map(|(node, a)| match a {
                Round1::Failed(why) => Some((*node, why.clone())),
                _ => None,
            })
            .collect();
        let slow = granted >= quorum(configured);
        let mut failure =
            self.quorum_failure(failed.into_iter(), granted, answers.iter().map(|(n, _)| *n));
        refusals.sort_by_key(|(node, _)| *node);
        failure.refused = refusals
            .into_iter()
            .map(|(node, said)| (self.nodes[node].label.clone(), said))
            .collect();
        if slow {
            // A majority granted, but only after the lease's validity was spent (a stalled node, a paused
            // process): the same claimant tries again.
            failure.failures.push((
                "round 1".to_string(),
                "took longer than the lease's validity".to_string(),
            ));
        }
        Attempt::Lost {
            outcome: ClaimOutcome::NoQuorum(failure),
            retry: if slow { Retry::Later } else { Retry::No },
        }
    }

    /// Classifies a request that reached a majority in round 1 but not in round 2.
    ///
    /// Unless so many nodes answered `claimed` that no majority is left, the outcome is ambiguous (answers
    /// lost or late, our lease expired on a node): the same claimant tries again, and finds its own
    /// confirmations as its own.
    fn lost_in_round2(&self, answers: &[(usize, Round2)], granted: usize) -> Attempt {
        let configured = self.nodes.len();
        let claimed: Vec<Option<&Holder>> = answers
            .iter()
            .filter_map(|(_, a)| match a {
                Round2::Claimed(by) => Some(by.as_ref()),
                _ => None,
            })
            .collect();
        let paused = answers.iter().find_map(|(_, a)| match a {
            Round2::Paused(pause) => Some(pause),
            _ => None,
        });
        let refused = answers
            .iter()
            .filter(|(_, a)| matches!(a, Round2::Paused(_)))
            .count();
        let spare = configured - quorum(configured);
        if claimed.len() > spare {
            let by = claimed.into_iter().flatten().next().cloned();
            return Attempt::Lost {
                outcome: ClaimOutcome::AlreadyClaimed { by },
                retry: Retry::No,
            };
        }
        // The pause reached nodes between our rounds: no majority is left, and the claim is refused for
        // good (see CONFIRM).
        if let Some(pause) = paused.filter(|_| refused + claimed.len() > spare) {
            return Attempt::Lost {
                outcome: ClaimOutcome::Paused(pause.clone()),
                retry: Retry::No,
            };
        }
        let failures = answers.iter().filter_map(|(node, answer)| match answer {
            Round2::Ok => None,
            Round2::Paused(_) => Some((*node, "the job is paused".to_string())),
            Round2::Lost => Some((*node, "lease lost before confirmation".to_string())),
            Round2::Claimed(_) => Some((*node, "claimed by another claimant".to_string())),
            Round2::Failed(why) => Some((*node, why.clone())),
        });
        let failure = self.quorum_failure(failures, granted, answers.iter().map(|(node, _)| *node));
        Attempt::Lost {
            outcome: ClaimOutcome::NoQuorum(failure),
            retry: Retry::Later,
        }
    }

    /// How long a contender that lost a split vote keeps away (before jitter): until the leader has
    /// finished the round it is in — which waits up to `node_timeout` for a node that does not answer,
    /// plus the nodes' time for a batch of `commands` (the leader's batch is taken to be like ours), both
    /// as the pace stretches them now (uncapped, so possibly longer than the leader's round 1, never
    /// shorter) — and started its next one `retry_delay / 4` later, with the rest of `retry_delay` to
    /// spare.
    ///
    /// A loser that came back after `retry_delay` alone, while the leader still waited for a hung node,
    /// took the nodes the others had freed before the leader could, and led the next split in its place
    /// if its value sorted first: with one node hung and one down, four workers took turns leading 2–2
    /// splits until the tick's window closed (`claims::a_split_vote_under_a_hung_node_goes_to_its_leader`).
    pub(super) fn yield_delay(&self, commands: usize) -> Duration {
        self.pace
            .budget(batch_budget(self.settings.node_timeout, commands))
            + self.settings.retry_delay
    }

    /// A [`QuorumFailure`] naming each failed node, and each node that had not answered (`answered` lists
    /// those that had) when the round was decided: unheard, not failed.
    pub(super) fn quorum_failure(
        &self,
        failed: impl Iterator<Item = (usize, String)>,
        granted: usize,
        answered: impl Iterator<Item = usize>,
    ) -> QuorumFailure {
        let mut failures: Vec<(usize, String)> = failed.collect();
        failures.sort_by_key(|(node, _)| *node);
        let answered: std::collections::HashSet<usize> = answered.collect();
        QuorumFailure {
            configured: self.nodes.len(),
            needed: quorum(self.nodes.len()),
            granted,
            failures: failures
                .into_iter()
                .map(|(node, why)| (self.nodes[node].label.clone(), why))
                .collect(),
            unheard: (0..self.nodes.len())
                .filter(|node| !answered.contains(node))
                .map(|node| self.nodes[node].label.clone())
                .collect(),
            refused: Vec::new(),
        }
    }
}

/// What a node that refused a claim in round 1 said, in a few words (`None` for a grant or a failure).
fn refusal(answer: &Round1) -> Option<String> {
    let worker = |holder: Option<&Holder>| {
        holder
            .map_or("another worker", |h| h.worker.as_str())
            .to_string()
    };
    Some(match answer {
        Round1::Claimed(by) => format!("the tick is claimed by {}", worker(by.as_ref())),
        Round1::Busy { value, .. } => {
            format!(
                "the job is held by {}",
                worker(Some(&Holder::from_value(value)))
            )
        }
        Round1::Paused(_) => "the job is paused".to_string(),
        Round1::Ahead { .. } => "the tick is far ahead of its clock".to_string(),
        Round1::Ok { .. } | Round1::Failed(_) => return None,
    })
}

/// Whether a node may hold this attempt's lease value after answering `answer` in round 1 (`None`: no
/// answer when the round was decided), so that undoing the attempt must reach it.
///
/// `ACQUIRE` runs atomically and returns its refusals before its `SET`: a node that answered `busy` holds
/// another value in the lease key, and one that answered `claimed`, `paused` or `ahead` did not write — but a kept
/// value (`fresh == false`, we led a split vote) may be there from our previous attempt, so only a fresh
/// one spares those nodes. Every other answer (`ok`, a failure, a timeout, no answer yet) may have left
/// our `SET` behind. Sparing the nodes that refused saves every loser of a race its undo: the one `RELEASE`
/// per node that made a clean loss cost as much as the claim.
fn may_hold_our_set(answer: Option<&Round1>, fresh: bool) -> bool {
    match answer {
        Some(Round1::Busy { .. }) => false,
        Some(Round1::Claimed(_) | Round1::Paused(_) | Round1::Ahead { .. }) => !fresh,
        Some(Round1::Ok { .. } | Round1::Failed(_)) | None => true,
    }
}

/// A node's `PTTL` answer as a duration (`None` for "no TTL" or "no key").
fn pttl_duration(pttl_ms: i64) -> Option<Duration> {
    u64::try_from(pttl_ms).ok().map(Duration::from_millis)
}

/// How long a node may take to answer a pipeline of `commands` scripts: `node_timeout` for the round trip,
/// plus the node's own time to run each script. Measured here: a pipeline of 1,000 `ACQUIRE`s costs a node
/// tens of milliseconds, and three workers send theirs at the same instant; a flat 50 ms failed every claim
/// at 1,000 jobs per tick. An `ACQUIRE` costs a node ~27 µs of CPU, but in a herd every node runs every
/// worker's pipeline while five nodes and three workers share two cores: a node answered a pipeline of
/// 10,000 after more than a second, and at 100 µs per command every claim of a 10,000-job herd failed
/// with "no answer within 1050 ms", again on each retry, until the tick's window closed. The budget only
/// bounds the wait for nodes that do not answer at all (a round is decided once a majority answered), so
/// a generous one costs nothing when the nodes are healthy.
pub(super) fn batch_budget(node_timeout: Duration, commands: usize) -> Duration {
    let commands = u32::try_from(commands).unwrap_or(u32::MAX);
    node_timeout + crate::lock::order::NODE_TIME_PER_CLAIM.saturating_mul(commands)
}
