//! The etcd store with a claim's transaction on its way: the member it went to (or the leader) killed or
//! hung while the write is in flight, and the write's answer (or the write itself) lost. What
//! `tests/it/etcd.rs` and `tests/it/etcd_failover.rs` fault between claims, these fault *during* one.
//!
//! One claimant (`slow`) reaches the members through a [`DelayProxy`] each, which knows its writes by its
//! name (its lease value is in the transaction's puts; its reads carry only keys); rivals reach the
//! members directly and race the same tick. Every round is one tick, decided as the worker decides it
//! (the same claimant until the outcome is final): exactly one of them wins it, every other one is told
//! the tick is taken, the winner's token is above every earlier round's, and a claim of the tick after
//! the fault is over finds it taken. Each test prints its tally (`--nocapture`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redcron::lock::{ClaimOutcome, Lease};
use redcron::store::Store;

use crate::etcd::{claim_until_final, request, settings, store};
use crate::support::{store_on, DelayProxy, EtcdCluster};

/// The claimant whose transactions the proxies hold back or lose; its name is their marker.
const SLOW: &str = "slow-claimant";

/// Ticks raced in each test, one fault each.
const ROUNDS: i64 = 12;

/// A store that reaches member `i` through `proxies[i]`.
fn store_through(proxies: &[DelayProxy]) -> Store {
    let endpoints: Vec<String> = proxies
        .iter()
        .map(|proxy| format!("http://127.0.0.1:{}", proxy.port()))
        .collect();
    store_on(&format!("etcd|{}", endpoints.join(",")), settings())
}

/// A proxy in front of every member of `cluster` that holds back or loses `SLOW`'s writes.
fn proxies(cluster: &EtcdCluster, hold: Duration) -> Vec<DelayProxy> {
    (0..cluster.len())
        .map(|member| DelayProxy::start(cluster.client_port(member), SLOW, hold))
        .collect()
}

/// A duration picked at random below `max_ms`.
fn random_ms(max_ms: u64) -> Duration {
    Duration::from_millis(rand::random_range(0..max_ms))
}

/// Each contender's final outcome of one round: its name and outcome, claimed as the worker claims.
async fn race(
    contenders: Vec<(String, Arc<Store>, Duration)>,
    job: &str,
    tick: i64,
) -> Vec<(String, ClaimOutcome)> {
    let tasks: Vec<_> = contenders
        .into_iter()
        .map(|(name, store, after)| {
            let request = request(&name, job, tick);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let outcome = claim_until_final(&store, &request).await;
                (name, outcome)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("a claim task"));
    }
    outcomes
}

/// The one winner of a round and its lease; panics unless exactly one contender won, every other was told
/// the tick is taken (a claim left undecided, or two winners, fails the test), and the winner's token is
/// above `last_token`, the previous round's (which it then becomes).
fn one_winner(
    round: i64,
    outcomes: Vec<(String, ClaimOutcome)>,
    last_token: &mut u64,
) -> (String, Lease) {
    let mut winners = Vec::new();
    for (name, outcome) in &outcomes {
        match outcome {
            ClaimOutcome::Won(lease) => winners.push((name.clone(), lease.clone())),
            ClaimOutcome::AlreadyClaimed { .. } => {}
            other => panic!("round {round}: {name} not decided: {other:?}; all: {outcomes:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
    let (winner, lease) = winners.remove(0);
    assert!(
        lease.token > *last_token,
        "round {round}: token {} after {last_token}",
        lease.token
    );
    *last_token = lease.token;
    (winner, lease)
}

/// A claimant that comes after the fault is over finds the tick taken, by the round's winner.
async fn still_taken(store: &Store, job: &str, tick: i64, winner: &str) {
    match claim_until_final(store, &request("latecomer", job, tick)).await {
        ClaimOutcome::AlreadyClaimed { by: Some(by) } => assert_eq!(by.worker, winner),
        other => panic!("tick {tick} won by {winner} is not taken after the fault: {other:?}"),
    }
}

/// Which member a mid-claim fault strikes, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, restarted after the round.
    Kill,
    /// SIGSTOP, continued after the round (its late copy of the write then reaches it).
    Hang,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_killed_while_a_claim_is_on_its_way_leaves_one_winner() {
    one_winner_through_faults(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_hung_while_a_claim_is_on_its_way_leaves_one_winner() {
    one_winner_through_faults(Fault::Hang).await;
}

/// A member killed (or hung) while a claim's transaction is on its way to it — every other round the
/// member it was sent to, else the leader, at a random moment of the 700 ms it is held — with two rivals
/// racing the tick from a random moment of the fault: each of 12 ticks is decided, won once, with a token
/// above every earlier tick's, and stays taken after the member is back.
async fn one_winner_through_faults(fault: Fault) {
    const HOLD: Duration = Duration::from_millis(700);
    let mut cluster = EtcdCluster::start();
    let proxies = proxies(&cluster, HOLD);
    let slow = Arc::new(store_through(&proxies));
    let rivals = [Arc::new(store(&cluster)), Arc::new(store(&cluster))];
    let checker = store(&cluster);
    let job = "in-flight";
    let mut last_token = 0;
    let mut wins = std::collections::BTreeMap::<String, usize>::new();
    let mut struck = (0, 0);
    for round in 1..=ROUNDS {
        let tick = round * 1_000;
        let held_before: Vec<usize> = proxies.iter().map(DelayProxy::delayed).collect();
        proxies.iter().for_each(|proxy| proxy.delay_next(1));
        let claim = tokio::spawn({
            let slow = Arc::clone(&slow);
            async move { race(vec![(SLOW.to_string(), slow, Duration::ZERO)], job, tick).await }
        });
        // The write is on its way once a proxy holds it; the fault strikes while it is held.
        let waited = Instant::now();
        let target = loop {
            let held = (0..proxies.len()).find(|&i| proxies[i].delayed() > held_before[i]);
            if let Some(member) = held {
                break member;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(20),
                "round {round}: no write held"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        tokio::time::sleep(random_ms(HOLD.as_millis() as u64)).await;
        let victim = if round % 2 == 0 {
            struck.0 += 1;
            target
        } else {
            struck.1 += 1;
            cluster.leader()
        };
        match fault {
            Fault::Kill => cluster.kill(victim),
            Fault::Hang => cluster.stop(victim),
        }
        let contenders: Vec<(String, Arc<Store>, Duration)> = rivals
            .iter()
            .enumerate()
            .map(|(i, store)| (format!("rival-{i}"), Arc::clone(store), random_ms(1_500)))
            .collect();
        let mut outcomes = race(contenders, job, tick).await;
        outcomes.extend(claim.await.expect("the slow claim"));
        match fault {
            Fault::Kill => cluster.restart(victim),
            Fault::Hang => cluster.cont(victim),
        }
        let (winner, lease) = one_winner(round, outcomes, &mut last_token);
        still_taken(&checker, job, tick, &winner).await;
        let holder = if winner == SLOW {
            &slow
        } else {
            &rivals[usize::from(winner.ends_with('1'))]
        };
        holder.release(&lease).await;
        *wins.entry(winner).or_default() += 1;
    }
    eprintln!(
        "{fault:?} mid-claim: {ROUNDS} ticks decided, each won once ({wins:?}); struck the member the \
         write went to {} times, the leader {} times",
        struck.0, struck.1
    );
}

/// A claim whose transaction reached a member but whose answer was lost (the connection cut before the
/// answer came back: 2 rounds in 3), or whose transaction itself was lost (1 in 3), on 1 to 3 copies per
/// member, while a rival races the tick from a random moment: settled by reading the claim back — each
/// of 12 ticks won once, the claimant whose answer was lost winning it when its write applied first, with
/// a token above every earlier tick's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_transaction_answer_is_settled_by_reading_back() {
    let cluster = EtcdCluster::start();
    // The time a write that reached its member gets to apply before its connection is cut.
    let proxies = proxies(&cluster, Duration::from_millis(300));
    let slow = Arc::new(store_through(&proxies));
    let rival = Arc::new(store(&cluster));
    let checker = store(&cluster);
    let job = "lost-answer";
    let mut last_token = 0;
    let (mut won_after_losing, mut lost_rounds, mut rival_wins) = (0, 0, 0);
    for round in 1..=ROUNDS {
        let tick = round * 1_000;
        let lose_answers = round % 3 != 0;
        for proxy in &proxies {
            let copies = rand::random_range(1..=3);
            if lose_answers {
                proxy.lose_answer_next(copies);
            } else {
                proxy.lose_request_next(copies);
            }
        }
        let lost_before: usize = proxies.iter().map(DelayProxy::lost).sum();
        let contenders = vec![
            (SLOW.to_string(), Arc::clone(&slow), Duration::ZERO),
            ("rival".to_string(), Arc::clone(&rival), random_ms(600)),
        ];
        let outcomes = race(contenders, job, tick).await;
        let lost = proxies.iter().map(DelayProxy::lost).sum::<usize>() > lost_before;
        let (winner, lease) = one_winner(round, outcomes, &mut last_token);
        still_taken(&checker, job, tick, &winner).await;
        lost_rounds += usize::from(lost);
        if winner == SLOW {
            won_after_losing += usize::from(lost);
            slow.release(&lease).await;
        } else {
            rival_wins += 1;
            rival.release(&lease).await;
        }
    }
    // The proxies must have lost something, or the test proved nothing.
    assert!(lost_rounds > 0, "no transaction of {SLOW} was lost");
    eprintln!(
        "lost answers: {ROUNDS} ticks decided, each won once; {SLOW} lost a transaction or its answer in \
         {lost_rounds} rounds and still won {won_after_losing} of them; the rival won {rival_wins}"
    );
}
