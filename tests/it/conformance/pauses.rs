//! Pause and resume: a paused job is refused in every series until resumed or its end, a shorter pause
//! keeps a longer one (unless replaced), a pause already over is not written, and a pause racing a claim
//! in flight is linearizable with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use redcron::lock::{
    ClaimOutcome, ClaimRequest, InForce, LockSettings, Overlap, Pause, PauseOutcome, Series,
};
use redcron::schedule::Tick;
use redcron::store::Store;

use super::{request, settled, warm};
use crate::support::{claim_until_final, Backend, Cluster, SETTLE};

fn pause(for_ms: Option<i64>) -> Pause {
    Pause {
        until: for_ms.map(|ms| Utc::now() + chrono::Duration::milliseconds(ms)),
        by: "ops@test".to_string(),
        reason: "migration".to_string(),
    }
}

/// A pause on every node refuses the claims of every series of the job (the schedule's, a retry's) and
/// leaves no claim record behind; `pauses` reads it from every node, and no pause of another job; after
/// `resume` (true once, false after) the refused tick is granted.
pub(super) async fn a_paused_job_is_refused_in_every_series_until_resumed(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    warm(&store).await;
    let outcome = store
        .pause("report", &pause(None), InForce::KeepLonger)
        .await;
    assert_eq!(
        outcome.expect("a majority took the pause"),
        PauseOutcome::Paused
    );
    let tick = Utc::now().timestamp_millis();
    let retry = request("a", "report", tick).in_series(Series::Retry(1), Tick(tick + 60_000));
    for claim in [request("a", "report", tick), retry] {
        assert_paused_for(&settled(&store, &claim).await, "migration");
    }
    if let Cluster::Redis(redis) = &cluster {
        for node in 0..redis.len() {
            assert_eq!(redis.get(node, "redcron:{report}:claim"), None);
            assert!(redis.get(node, "redcron:{report}:paused").is_some());
        }
    }
    let read = store
        .pauses(&["report".into(), "other".into()])
        .await
        .expect("read");
    assert_eq!(read.value[0].as_ref().map(|r| r.nodes), Some(cluster.len()));
    assert_eq!(read.value[1], None);
    assert!(store.resume("report").await.expect("resumed"));
    assert!(!store.resume("report").await.expect("resumed again"));
    // The tick refused while paused was never claimed: it is granted now.
    match settled(&store, &request("a", "report", tick)).await {
        ClaimOutcome::Won(lease) => store.release(&lease).await,
        other => panic!("expected the refused tick to be granted after resume, got {other:?}"),
    }
}

/// `--for`: a pause of 2 s refuses claims, then ends by itself on every node (Redis: a key's TTL; etcd: an
/// etcd lease; embedded: a row's end on the host's clock): the tick is granted and no pause is read.
pub(super) async fn a_pause_for_a_while_ends_by_itself(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    warm(&store).await;
    let outcome = store
        .pause("report", &pause(Some(2_000)), InForce::KeepLonger)
        .await;
    assert_eq!(outcome.expect("paused"), PauseOutcome::Paused);
    assert_paused_for(
        &settled(&store, &request("a", "report", 1_000)).await,
        "migration",
    );
    tokio::time::sleep(backend.expiry(Duration::from_secs(2))).await;
    // etcd's leases: the whole seconds, its expiry check, the revoke's commit; margins for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match settled(&store, &request("a", "report", 1_000)).await {
            ClaimOutcome::Won(_) => break,
            ClaimOutcome::Paused(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("expected the pause over, got {other:?}"),
        }
    }
    let read = store.pauses(&["report".into()]).await.expect("read");
    assert_eq!(read.value, [None]);
}

/// A pause that had ended when it was written is not written; a shorter pause leaves a longer one in
/// force as it was (value, and on Redis its TTL on every node), also one that is over; `Replace` replaces
/// it; a pause without end replaces one with an end.
pub(super) async fn a_shorter_pause_keeps_the_longer_in_force_unless_replaced(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let why = |for_ms, reason: &str| Pause {
        reason: reason.to_string(),
        ..pause(for_ms)
    };
    let pause_now = |pause: Pause, in_force| {
        let store = &store;
        async move {
            store
                .pause("report", &pause, in_force)
                .await
                .expect("answered")
        }
    };
    let reason_in_force = || async {
        let read = store.pauses(&["report".to_string()]).await.expect("read");
        read.value[0].as_ref().map(|read| read.pause.reason.clone())
    };
    let keep = InForce::KeepLonger;
    assert_eq!(
        pause_now(why(Some(-1), "over"), keep).await,
        PauseOutcome::AlreadyOver
    );
    assert_eq!(reason_in_force().await, None, "a pause over is not written");

    assert_eq!(
        pause_now(why(Some(3_600_000), "long"), keep).await,
        PauseOutcome::Paused
    );
    for shorter in [why(Some(2_000), "short"), why(Some(-1), "over")] {
        match pause_now(shorter, keep).await {
            PauseOutcome::LongerKept(kept) => assert_eq!(kept.reason, "long"),
            other => panic!("expected the longer pause kept, got {other:?}"),
        }
    }
    assert_eq!(reason_in_force().await.as_deref(), Some("long"));
    assert_paused_for(&store.claim(&request("a", "report", 1_000)).await, "long");
    if let Cluster::Redis(redis) = &cluster {
        for node in 0..redis.len() {
            let pttl: i64 = redis.query(node, ::redis::cmd("PTTL").arg("redcron:{report}:paused"));
            assert!(
                pttl > 3_000_000,
                "node {node}: the long pause's TTL is {pttl} ms"
            );
        }
    }
    assert_eq!(
        pause_now(why(Some(-1), "over"), InForce::Replace).await,
        PauseOutcome::AlreadyOver
    );
    assert_eq!(
        pause_now(why(Some(2_000), "short"), InForce::Replace).await,
        PauseOutcome::Paused
    );
    assert_eq!(reason_in_force().await.as_deref(), Some("short"));
    assert_eq!(
        pause_now(why(None, "until resumed"), keep).await,
        PauseOutcome::Paused
    );
    match pause_now(why(Some(3_600_000), "long"), keep).await {
        PauseOutcome::LongerKept(kept) => assert_eq!(kept.reason, "until resumed"),
        other => panic!("expected the pause without end kept, got {other:?}"),
    }
    assert!(store.resume("report").await.expect("resumed"));
}

fn assert_paused_for(outcome: &ClaimOutcome, reason: &str) {
    match outcome {
        ClaimOutcome::Paused(pause) => assert_eq!(pause.reason, reason),
        other => panic!("expected Paused, got {other:?}"),
    }
}

/// How one claim raced one `pause` of its job: when each began and returned, and the claim's outcome.
struct Race {
    claim: (Instant, Instant),
    pause: (Instant, Instant),
    outcome: ClaimOutcome,
}

/// One claim of `tick` by `claimant` and one `pause` of `job` by `operator`, the second started `offset`
/// after the first (the claim first for a positive offset).
async fn race_once(
    claimant: &Arc<Store>,
    operator: &Arc<Store>,
    job: &str,
    tick: i64,
    offset: i64,
) -> Race {
    let wait = |us: i64| Duration::from_micros(u64::try_from(us).unwrap_or(0));
    let request = ClaimRequest::new("claimant", job, Tick(tick), Overlap::Skip, "f");
    let claim = tokio::spawn({
        let claimant = Arc::clone(claimant);
        async move {
            tokio::time::sleep(wait(-offset)).await;
            let start = Instant::now();
            let outcome = claimant.claim(&request).await;
            ((start, Instant::now()), outcome)
        }
    });
    let pausing = tokio::spawn({
        let (operator, job) = (Arc::clone(operator), job.to_string());
        async move {
            tokio::time::sleep(wait(offset)).await;
            let start = Instant::now();
            operator
                .pause(&job, &pause(None), InForce::KeepLonger)
                .await
                .expect("a majority took the pause");
            (start, Instant::now())
        }
    });
    let (claim, outcome) = claim.await.expect("the claim task");
    let pause = pausing.await.expect("the pause task");
    Race {
        claim,
        pause,
        outcome,
    }
}

/// `pause` racing a claim of a tick of its job, 40 times (a new job each time), started a random moment
/// apart within about the time each takes, from two stores (two processes' connections): the two are
/// linearizable — a claim that began after `pause` returned is refused (`Paused`), one that returned
/// before `pause` began is won, those in between go either way — and afterwards the pause stands: another
/// claimant's claim of the tick, and the claim of the next tick, are refused. Returns the tally.
async fn pause_races_claims(claimant: Store, operator: Store) -> String {
    const RACES: i64 = 40;
    let (claimant, operator) = (Arc::new(claimant), Arc::new(operator));
    // Offsets within the time one claim or pause takes (the median so far: a loaded machine has outliers).
    let took = |race: &Race| {
        let micros = |(start, end): (Instant, Instant)| (end - start).as_micros() as i64;
        micros(race.claim).max(micros(race.pause))
    };
    let mut durations = Vec::new();
    for warm_up in 0..3 {
        let warm = race_once(&claimant, &operator, &format!("warm-{warm_up}"), 1_000, 0).await;
        durations.push(took(&warm));
    }
    let median = |durations: &mut Vec<i64>| {
        durations.sort_unstable();
        durations[durations.len() / 2].max(200)
    };
    let (mut won, mut paused, mut undecided, mut overlapped) = (0, 0, 0, 0);
    for race in 1..=RACES {
        let (job, tick) = (format!("race-{race}"), race * 1_000);
        let spread = median(&mut durations);
        let offset = rand::random_range(-spread..=spread);
        let raced = race_once(&claimant, &operator, &job, tick, offset).await;
        durations.push(took(&raced));
        let Race {
            claim,
            pause,
            outcome,
        } = raced;
        let overlap = claim.0 < pause.1 && pause.0 < claim.1;
        overlapped += usize::from(overlap);
        match outcome {
            ClaimOutcome::Won(lease) => {
                assert!(
                    claim.0 < pause.1,
                    "race {race}: a claim begun after the pause won"
                );
                won += 1;
                claimant.release(&lease).await;
            }
            ClaimOutcome::Paused(_) => {
                assert!(
                    claim.1 > pause.0,
                    "race {race}: a claim done before the pause was refused"
                );
                paused += 1;
            }
            // A claim that found no quorum in time (a loaded machine): neither granted nor refused.
            ClaimOutcome::NoQuorum(_) => undecided += 1,
            other => panic!("race {race}: {other:?}"),
        }
        for (who, at) in [("rival", tick), ("claimant", tick + 1_000)] {
            let request = ClaimRequest::new(who, &job, Tick(at), Overlap::Skip, "f");
            let after = claim_until_final(&claimant, &request, SETTLE).await;
            assert!(
                matches!(after, ClaimOutcome::Paused(_)),
                "race {race}: {who}'s claim of {at} after the pause: {after:?}"
            );
        }
    }
    assert!(
        won + paused >= RACES as usize / 2,
        "too few races decided: {won} won, {paused} paused"
    );
    assert!(overlapped > 0, "no claim overlapped a pause");
    format!(
        "{RACES} pauses racing a claim ({overlapped} overlapping in time, offsets within {} µs): {won} \
         claims won, {paused} refused as paused, {undecided} without quorum; 0 won after the pause \
         returned; the pause stood every time",
        median(&mut durations)
    )
}

/// `pause` racing a claim in flight, from two stores on the cluster (two processes' connections; on the
/// embedded store two connections to its file): see [`pause_races_claims`].
pub(super) async fn a_pause_racing_a_claim_in_flight_is_linearizable(backend: Backend) {
    let cluster = backend.start_shared();
    let settings = LockSettings::default();
    let tally = pause_races_claims(cluster.store(settings.clone()), cluster.store(settings)).await;
    eprintln!("{backend:?}: {tally}");
}
