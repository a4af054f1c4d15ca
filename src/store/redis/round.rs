//! One round: a pipeline sent to every node in parallel, decided as soon as a majority is known.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{Pipeline, Value};
use tokio::time::Instant;

use super::RedisStore;
use crate::lock::quorum::{quorum, Decision, Tally, Vote};
use crate::store::pace::MAX_STRETCH;

impl RedisStore {
    /// Sends `pipeline` to every node in the background, bounded by the TTL (after which the keys it
    /// would delete have expired anyway).
    pub(super) fn spawn_everywhere(&self, pipeline: Pipeline) {
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

    /// Sends each node its own pipeline (`pipelines[i]` to node `i`; empty ones are not sent) in the
    /// background, bounded by the TTL like [`RedisStore::spawn_everywhere`].
    pub(super) fn spawn_on_each(&self, pipelines: Vec<Pipeline>) {
        let nodes = Arc::clone(&self.nodes);
        let timeout = self.settings.ttl;
        let work: Vec<(usize, Pipeline)> = pipelines
            .into_iter()
            .enumerate()
            .filter(|(_, pipeline)| pipeline.cmd_iter().next().is_some())
            .collect();
        if work.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let mut all: FuturesUnordered<_> = work
                .iter()
                .map(|(node, pipeline)| nodes[*node].eval(pipeline, timeout))
                .collect();
            while all.next().await.is_some() {}
        });
    }

    /// Sends one pipeline to every node in parallel and collects, per command, each node's parsed answer,
    /// until every command's outcome is decided or the round's budget has passed: `configured` as the
    /// store's [`Pace`](crate::store::pace::Pace) stretches it, at most `cap` — read again when the
    /// budget passes, and waited on if it grew meanwhile; and if no node at all has answered by then,
    /// waited on to the round's longest wait (`MAX_STRETCH` budgets, at most `cap`). A node silent at the
    /// end counts as failed ("no answer within …").
    ///
    /// Tells the pace when a majority of nodes had answered — after the round, in the background, when
    /// the budget passed first: answers that come late are what stretches later rounds, and nodes that
    /// never answer (hung, partitioned) stretch nothing.
    ///
    /// Returns, for each answer of the pipeline (each command's, or with [`Shape::Calls`] each claim's of
    /// each call, in order), the answers as `(node index, answer)`; nodes that had not answered when the
    /// round was decided are absent.
    pub(super) async fn round<A>(
        &self,
        (pipeline, shape): (Pipeline, Shape),
        configured: Duration,
        cap: Duration,
        parse: fn(Value) -> A,
        failed: fn(String) -> A,
        vote: impl Fn(&A) -> Vote,
    ) -> Vec<Vec<(usize, A)>> {
        let mut budget = self.pace.budget(configured).min(cap);
        let start = Instant::now();
        let (needed, mut answered) = (quorum(self.nodes.len()), 0);
        let commands = pipeline.cmd_iter().count();
        let count = shape.answers(commands);
        let mut answers: Vec<Vec<(usize, A)>> = (0..count).map(|_| Vec::new()).collect();
        let mut tallies: Vec<Tally> = (0..count).map(|_| Tally::new(self.nodes.len())).collect();
        // Each request owns what it needs, so that the stragglers can be watched after the round.
        let late = configured.mul_f64(MAX_STRETCH).max(budget);
        let pipeline = Arc::new(pipeline);
        let mut pending: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|index| {
                let (nodes, pipeline) = (Arc::clone(&self.nodes), Arc::clone(&pipeline));
                async move { (index, nodes[index].eval(&pipeline, late).await) }
            })
            .collect();
        let mut heard = vec![false; self.nodes.len()];
        loop {
            let (node, result) = match tokio::time::timeout_at(start + budget, pending.next()).await
            {
                Ok(Some(answer)) => answer,
                Ok(None) => break,
                Err(_) => {
                    // Answers that came meanwhile may have stretched the pace (a herd's batches go out
                    // at once, before any answer could; their first majorities come late but in time):
                    // the round then waits as long as one sent now would.
                    let stretched = self.pace.budget(configured).min(cap);
                    if stretched > budget {
                        budget = stretched;
                        continue;
                    }
                    // Not one node has answered, not even with an error: the nodes are busy, not gone
                    // (a herd's first batches go out before any answer could stretch the pace), and
                    // giving up now would have them do the work anyway and the claim retried with more.
                    // So the round waits on, as long as it ever waits. Every node hung or cut off costs
                    // that wait, when nothing can be won anyway; a node that answered (a live minority,
                    // a refused connection) keeps the budget as it was.
                    let longest = late.min(cap);
                    if !heard.contains(&true) && budget < longest {
                        budget = longest;
                        continue;
                    }
                    let why = format!("no answer within {} ms", budget.as_millis());
                    for node in (0..heard.len()).filter(|node| !heard[*node]) {
                        record_failure(&mut answers, &mut tallies, node, &why, failed, &vote);
                    }
                    break;
                }
            };
            heard[node] = true;
            // A reply the tally counts as a failure (a wrong count of results) is no answer here either.
            if matches!(&result, Ok(values) if values.len() == commands) {
                answered += 1;
                if answered == needed {
                    self.pace.majority_after(start.elapsed(), configured);
                }
            }
            match result {
                Ok(values) if values.len() == commands => {
                    for (index, answer) in
                        shape.unpack(values, parse, failed).into_iter().enumerate()
                    {
                        tallies[index].add(&vote(&answer));
                        answers[index].push((node, answer));
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
        if answered < needed && !pending.is_empty() {
            let pace = Arc::clone(&self.pace);
            tokio::spawn(async move {
                while let Some((_, result)) = pending.next().await {
                    if matches!(&result, Ok(values) if values.len() == commands) {
                        answered += 1;
                        if answered == needed {
                            pace.majority_after(start.elapsed(), configured);
                            return;
                        }
                    }
                }
            });
        }
        answers
    }
}

/// How a round's replies map to its answers: [`RedisStore::round`] takes a pipeline with its shape.
pub(super) enum Shape {
    /// One answer per command.
    Commands,
    /// Per command a script call of a batch ([`super::scripts::Calls`]): its claim count, and one array
    /// reply of that many answers.
    Calls(Vec<usize>),
}

impl Shape {
    /// How many answers a pipeline of `commands` commands gives.
    fn answers(&self, commands: usize) -> usize {
        match self {
            Shape::Commands => commands,
            Shape::Calls(sizes) => sizes.iter().sum(),
        }
    }

    /// One node's replies (one per command) as answers: a call's reply that is not an array of its claim
    /// count (a server error, a garbled reply) fails each of its claims, with the reason.
    pub(super) fn unpack<A>(
        &self,
        values: Vec<Value>,
        parse: fn(Value) -> A,
        failed: fn(String) -> A,
    ) -> Vec<A> {
        let Shape::Calls(sizes) = self else {
            return values.into_iter().map(parse).collect();
        };
        let mut answers = Vec::with_capacity(self.answers(values.len()));
        for (value, &size) in values.into_iter().zip(sizes) {
            match value {
                Value::Array(items) if items.len() == size => {
                    answers.extend(items.into_iter().map(parse));
                }
                Value::ServerError(error) => {
                    let why = super::reply::describe(&error);
                    answers.extend((0..size).map(|_| failed(why.clone())));
                }
                other => {
                    let why = format!("unexpected reply to a call of {size}: {other:?}");
                    answers.extend((0..size).map(|_| failed(why.clone())));
                }
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
pub(super) fn evalsha(script: &redis::Script, keys: &[String], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use redis::Value;
    use testkit::{DelayProxy, RedisCluster};

    use super::Shape;
    use crate::lock::quorum::Vote;
    use crate::lock::LockSettings;
    use crate::store::redis::RedisStore;

    /// One round of a `SET` of `key` on every node of `store`: how many nodes set it, and how long the
    /// round took.
    async fn set_round(
        store: &RedisStore,
        key: &str,
        budget: Duration,
        cap: Duration,
    ) -> (usize, Duration) {
        let mut pipeline = redis::pipe();
        pipeline.cmd("SET").arg(key).arg("v");
        let sent = Instant::now();
        let answers = store
            .round(
                (pipeline, Shape::Commands),
                budget,
                cap,
                |value| value == Value::Okay,
                |_| false,
                |&done| {
                    if done {
                        Vote::Granted
                    } else {
                        Vote::Failed("no OK".to_string())
                    }
                },
            )
            .await;
        let set = answers.into_iter().next().unwrap_or_default();
        (set.iter().filter(|(_, done)| *done).count(), sent.elapsed())
    }

    fn store_on(urls: &[String], budget: Duration) -> RedisStore {
        let settings = LockSettings {
            node_timeout: budget,
            ..LockSettings::default()
        };
        RedisStore::new(urls, settings).expect("a store")
    }

    /// A round whose budget passes after answers that came meanwhile stretched the pace waits on, as one
    /// sent then would. Two rounds of a `SET` on three nodes, each behind a proxy that holds the first
    /// round for HOLD and the second, behind it on the node's connection, for HOLD more: the first
    /// round's majority, in time, stretches the pace, and the second's comes after the budget it was
    /// sent with. Without the second look at the pace when the budget passes, the second round fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_that_come_during_a_round_stretch_its_own_wait() {
        const HOLD: Duration = Duration::from_millis(900);
        const MARKER: &str = "held-back-set";
        let budget = Duration::from_millis(1_500);
        let redis = RedisCluster::start(3);
        let proxies: Vec<DelayProxy> = (0..redis.len())
            .map(|node| DelayProxy::start(redis.port(node), MARKER, HOLD))
            .collect();
        let urls: Vec<String> = proxies.iter().map(DelayProxy::url).collect();
        let store = store_on(&urls, budget);
        let round = |key| set_round(&store, key, budget, Duration::MAX);
        assert!(round("warm-up").await.0 >= 2, "the nodes answer");
        proxies.iter().for_each(|proxy| proxy.delay_next(2));
        let first = round(MARKER);
        let second = async {
            // Sent once every proxy holds the first, so that it is held on its own after it.
            while proxies.iter().any(|proxy| proxy.delayed() == 0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            round(MARKER).await
        };
        let ((first, _), (second, waited)) = tokio::join!(first, second);
        assert!(
            first >= 2,
            "the first round, answered after HOLD, is within its budget"
        );
        assert!(
            second >= 2,
            "the second round waits as long as the first majority stretched the pace"
        );
        assert!(
            waited > budget,
            "the second round was decided within the budget it was sent with ({waited:?}): the test \
             proves nothing"
        );
    }

    /// A round that has heard from no node at all when its budget passes waits on: the nodes are busy,
    /// as under a herd's first batches, not gone. Three nodes, each behind a proxy that holds the round
    /// for three budgets (the pace unstretched: every round before was quick). Given up at its budget,
    /// the round would have no node, and a claim would be retried with the nodes' work done twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_that_heard_from_no_node_waits_on_for_busy_nodes() {
        const MARKER: &str = "busy-set";
        let budget = Duration::from_millis(300);
        let redis = RedisCluster::start(3);
        let proxies: Vec<DelayProxy> = (0..redis.len())
            .map(|node| DelayProxy::start(redis.port(node), MARKER, budget * 3))
            .collect();
        let urls: Vec<String> = proxies.iter().map(DelayProxy::url).collect();
        let store = store_on(&urls, budget);
        assert!(set_round(&store, "warm-up", budget, Duration::MAX).await.0 >= 2);
        proxies.iter().for_each(|proxy| proxy.delay_next(1));
        let (set, waited) = set_round(&store, MARKER, budget, Duration::MAX).await;
        assert!(
            set >= 2,
            "a majority set it after {waited:?}: the round waited for the busy nodes"
        );
        assert!(
            waited > budget,
            "decided within the budget ({waited:?}): the test proves nothing"
        );
    }

    /// What waiting on costs is bounded: with every node hung (SIGSTOP), a round fails after its
    /// longest wait ([`MAX_STRETCH`](crate::store::pace::MAX_STRETCH) budgets), or at its cap when that is
    /// sooner; and once a node has answered — here with a failure (killed: its connection refused at
    /// once) — the others are given up at the budget, as before (a live minority with a hung majority:
    /// `conformance::redis::a_hung_minority_costs_one_node_timeout`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hung_nodes_are_given_up_after_the_longest_wait_and_at_the_budget_once_one_answered() {
        let budget = Duration::from_millis(200);
        let longest = budget * 10;
        let mut redis = RedisCluster::start(3);
        let store = store_on(&redis.urls(), budget);
        assert!(set_round(&store, "warm-up", budget, Duration::MAX).await.0 >= 2);
        (0..redis.len()).for_each(|node| redis.stop(node));
        let (set, waited) = set_round(&store, "hung", budget, Duration::MAX).await;
        assert_eq!(set, 0);
        assert!(
            waited >= longest && waited < longest * 3,
            "every node hung: failed after {waited:?}, the longest wait being {longest:?}"
        );
        let cap = budget * 3;
        let (set, waited) = set_round(&store, "hung-capped", budget, cap).await;
        assert_eq!(set, 0);
        assert!(
            waited >= cap && waited < longest,
            "capped at {cap:?}: failed after {waited:?}"
        );
        redis.kill(0);
        let (set, waited) = set_round(&store, "one-failed", budget, Duration::MAX).await;
        assert_eq!(set, 0);
        assert!(
            waited >= budget && waited < longest,
            "a node answered: the hung ones given up after {waited:?}, not the longest wait"
        );
    }

    fn text(value: Value) -> Result<String, String> {
        match value {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            other => Err(format!("{other:?}")),
        }
    }

    /// Each call's array reply becomes its claims' answers, in order; a call whose reply has another count
    /// or is no array fails each of its claims, and only those.
    #[test]
    fn calls_unpack_into_their_claims_answers() {
        let item = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let shape = Shape::Calls(vec![2, 1, 2]);
        let answers = shape.unpack(
            vec![
                Value::Array(vec![item("a"), item("b")]),
                Value::Array(vec![item("c"), item("d")]),
                Value::Okay,
            ],
            text,
            Err,
        );
        assert_eq!(answers.len(), 5);
        assert_eq!(answers[..2], [Ok("a".to_string()), Ok("b".to_string())]);
        assert!(matches!(&answers[2], Err(why) if why.contains("a call of 1")));
        assert!(answers[3..]
            .iter()
            .all(|a| matches!(a, Err(why) if why.contains("a call of 2"))));
        let plain = Shape::Commands.unpack(vec![item("x")], text, Err);
        assert_eq!(plain, [Ok("x".to_string())]);
    }
}
