//! The two rounds of a claim, and what a lost attempt means.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::reply::{parse_round1, parse_status, Round1};
use super::round::evalsha;
use super::{claim_keys, token_floor, Attempt, RedisStore, Retry, Try};
use crate::lock::quorum::{quorum, Vote};
use crate::lock::{scripts, validity, ClaimOutcome, ClaimRequest, Lease, QuorumFailure};

impl RedisStore {
    /// One attempt at every request of the batch: round 1, then round 2 for those that reached a majority.
    pub(super) async fn attempt(&self, worker_id: &str, tries: &[Try<'_>]) -> Vec<Attempt> {
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
            batch_budget(settings.node_timeout, tries.len()),
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
                .min(batch_budget(settings.node_timeout, confirming.len()));
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
    pub(super) fn quorum_failure(
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
}

/// How long a node may take to answer a pipeline of `commands` scripts: `node_timeout` for the round trip,
/// plus the node's own time to run each script. Measured here: a pipeline of 1,000 `ACQUIRE`s costs a node
/// tens of milliseconds, and three workers send theirs at the same instant; a flat 50 ms failed every claim
/// at 1,000 jobs per tick.
fn batch_budget(node_timeout: Duration, commands: usize) -> Duration {
    const PER_COMMAND: Duration = Duration::from_micros(100);
    node_timeout + PER_COMMAND * u32::try_from(commands).unwrap_or(u32::MAX)
}
