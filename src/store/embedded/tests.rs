//! The embedded store's rules, each against a database file in a temporary directory: the memory store's
//! tests, ported, and what persistence adds — a reopened store (a restarted worker) and a second
//! connection to the same file (a second worker process) see the same claims, fences and leases.

use std::time::Duration;

use chrono::DateTime;
use tempfile::TempDir;

use super::EmbeddedStore;
use crate::history::{Entry, HistorySettings, Kind, Query};
use crate::lock::keys::{token_floor, MAX_TOKEN};
use crate::lock::{
    ClaimOutcome, ClaimRequest, Lease, LockSettings, Overlap, Refusal, RenewError, Series,
};
use crate::membership::Member;
use crate::schedule::Tick;
use crate::store::{Claims, Leases, Records, StoreError};

fn open(dir: &TempDir, ttl_ms: u64) -> EmbeddedStore {
    let settings = LockSettings {
        ttl: Duration::from_millis(ttl_ms),
        ..LockSettings::default()
    };
    let history = HistorySettings {
        keep_ticks: 3,
        ..HistorySettings::default()
    };
    EmbeddedStore::open(&dir.path().join("state/redcron.db"), settings, history)
        .expect("the store opens")
}

fn store(ttl_ms: u64) -> (TempDir, EmbeddedStore) {
    let dir = TempDir::new().expect("a temporary directory");
    let store = open(&dir, ttl_ms);
    (dir, store)
}

fn request(worker: &str, tick: i64) -> ClaimRequest {
    ClaimRequest::new(worker, "job", Tick(tick), Overlap::Skip, "f")
}

async fn claim(store: &EmbeddedStore, worker: &str, tick: i64) -> ClaimOutcome {
    store.claim_many(&[request(worker, tick)]).await.remove(0)
}

fn won(outcome: ClaimOutcome) -> Lease {
    match outcome {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

#[tokio::test]
async fn claims_once_and_tokens_increase() {
    let (_dir, store) = store(1000);
    let first = won(claim(&store, "a", 1_000).await);
    let again = claim(&store, "b", 1_000).await;
    assert!(matches!(again, ClaimOutcome::AlreadyClaimed { .. }));
    let busy = claim(&store, "b", 2_000).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }));
    store.release(&first).await;
    let after = claim(&store, "b", 1_000).await;
    assert!(matches!(after, ClaimOutcome::AlreadyClaimed { .. }));
    let second = won(claim(&store, "b", 2_000).await);
    assert!(second.token > first.token);
}

#[tokio::test]
async fn expired_lease_is_lost_for_good_and_release_spares_the_next_holder() {
    // b's lease must outlive the four calls after it (each an fsync'd commit, slow on a loaded machine),
    // so the TTL is a second rather than 100 ms.
    let (_dir, store) = store(1_000);
    let mut a = won(claim(&store, "a", 1_000).await);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let b = won(claim(&store, "b", 2_000).await);
    assert!(b.token > a.token);
    assert_eq!(store.renew(&mut a).await, Err(RenewError::Expired));
    assert_eq!(store.renew(&mut a).await, Err(RenewError::AlreadyLost));
    store.release(&a).await;
    let busy = claim(&store, "c", 3_000).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }));
}

#[tokio::test]
async fn renewal_keeps_a_lease_past_its_ttl() {
    let (_dir, store) = store(1_000);
    let mut a = won(claim(&store, "a", 1_000).await);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        store
            .renew(&mut a)
            .await
            .expect("renewal within the validity");
    }
    assert!(a.is_valid());
    let busy = claim(&store, "b", 2_000).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }));
}

/// Workers that disagree on `overlap` take different lease keys, but meet on the claim record: one
/// (job, tick) is still granted once (finding 1 of the protocol review, on the embedded store).
#[tokio::test]
async fn workers_that_disagree_on_overlap_still_claim_a_tick_once() {
    let (_dir, store) = store(1_000);
    let skip = ClaimRequest::new("a", "job", Tick(1_000), Overlap::Skip, "f1");
    let allow = ClaimRequest::new("b", "job", Tick(1_000), Overlap::Allow, "f2");
    won(store.claim_many(&[skip]).await.remove(0));
    match store.claim_many(&[allow]).await.remove(0) {
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
    let (_dir, store) = store(1_000);
    let request = ClaimRequest::new("a", "job", Tick(1_000), Overlap::Skip, "f");
    let first = won(store
        .claim_many(std::slice::from_ref(&request))
        .await
        .remove(0));
    store.release(&first).await;
    let again = won(store.claim_many(&[request]).await.remove(0));
    assert!(again.token > first.token);
}

/// A reopened store (a restarted worker) keeps the claims and the fence: an earlier tick stays claimed,
/// the lease of the previous process still holds the job, and tokens go on rising.
#[tokio::test]
async fn claims_fences_and_leases_survive_a_reopen() {
    let dir = TempDir::new().expect("a temporary directory");
    let first = won(claim(&open(&dir, 60_000), "a", 5_000).await);
    let store = open(&dir, 60_000);
    let early = claim(&store, "b", 4_000).await;
    assert!(
        matches!(early, ClaimOutcome::AlreadyClaimed { .. }),
        "{early:?}"
    );
    let busy = claim(&store, "b", 6_000).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }), "{busy:?}");
    store.release(&first).await;
    let next = won(claim(&store, "b", 6_000).await);
    assert!(next.token > first.token);
}

/// Two stores on one file (two worker processes of a host) race for the same ticks: each tick is won
/// once, and the tokens of the wins strictly increase.
#[tokio::test]
async fn two_connections_on_one_file_grant_each_tick_once() {
    let dir = TempDir::new().expect("a temporary directory");
    let (a, b) = (open(&dir, 60_000), open(&dir, 60_000));
    let mut tokens = Vec::new();
    for tick in 1..=20 {
        let request = |worker| ClaimRequest::new(worker, "job", Tick(tick), Overlap::Allow, "f");
        let (ra, rb) = ([request("a")], [request("b")]);
        let (x, y) = tokio::join!(a.claim_many(&ra), b.claim_many(&rb));
        let wins: Vec<Lease> = x
            .into_iter()
            .chain(y)
            .filter_map(|outcome| match outcome {
                ClaimOutcome::Won(lease) => Some(lease),
                ClaimOutcome::AlreadyClaimed { .. } => None,
                other => panic!("tick {tick}: unexpected {other:?}"),
            })
            .collect();
        assert_eq!(wins.len(), 1, "tick {tick} won {} times", wins.len());
        tokens.push(wins[0].token);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// A lease stored in another boot of the host has expired, whatever its time on the boot clock says.
#[tokio::test]
async fn a_lease_of_another_boot_has_expired() {
    let (dir, store) = store(60_000);
    won(claim(&store, "a", 1_000).await);
    let file = rusqlite::Connection::open(dir.path().join("state/redcron.db")).expect("open");
    file.execute("UPDATE leases SET boot_id = 'an-earlier-boot'", [])
        .expect("update");
    won(claim(&store, "b", 2_000).await);
}

/// A file that is not a database, or a directory that cannot be made, fails with the path named.
#[test]
fn an_unusable_file_is_an_error_that_names_it() {
    let dir = TempDir::new().expect("a temporary directory");
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![b'x'; 8192]).expect("write");
    let under_a_file = garbage.join("redcron.db");
    for path in [garbage, under_a_file] {
        let opened = EmbeddedStore::open(&path, LockSettings::default(), Default::default());
        match opened {
            Err(error @ StoreError::Embedded { .. }) => {
                assert!(
                    error.to_string().contains(&path.display().to_string()),
                    "{error}"
                );
            }
            Err(other) => panic!("{path:?}: unexpected error {other}"),
            Ok(_) => panic!("{path:?} opened"),
        }
    }
}

fn entry(tick: i64, worker: &str, kind: Kind, second: i64) -> Entry {
    let at = DateTime::from_timestamp(second, 0).expect("a time");
    Entry::new("job", Tick(tick), worker, kind, at)
}

fn query(limit: usize) -> Query {
    Query {
        job: "job".into(),
        since: None,
        until: None,
        limit,
    }
}

/// History keeps the newest `keep_ticks` ticks (3 here), a later version of an entry replaces the
/// earlier, reads are newest first within the limit, and all of it survives a reopen.
#[tokio::test]
async fn history_is_bounded_newest_first_and_survives_a_reopen() {
    let dir = TempDir::new().expect("a temporary directory");
    let store = open(&dir, 1_000);
    for tick in 1..=5 {
        let entries = [
            entry(tick, "w1", Kind::Run, tick),
            entry(tick, "w2", Kind::Lost, tick),
        ];
        store.record(&entries).await.expect("recorded");
    }
    let mut ended = entry(5, "w1", Kind::Run, 9);
    ended.outcome = Some("success".into());
    store.record(&[ended.clone()]).await.expect("recorded");
    drop(store);
    let store = open(&dir, 1_000);
    let all = store.history(&query(100)).await.expect("read").value;
    let ticks: Vec<i64> = all.iter().map(|e| e.tick).collect();
    assert_eq!(ticks, [5, 5, 4, 4, 3, 3]);
    assert_eq!(all[0], ended);
    let three = store.history(&query(3)).await.expect("read").value;
    let ids: Vec<String> = three.iter().map(Entry::id).collect();
    assert_eq!(ids, ["5|w1|run", "5|w2|lost", "4|w1|run"]);
    let mut window = query(100);
    (window.since, window.until) = (Some(Tick(4)), Some(Tick(4)));
    assert_eq!(store.history(&window).await.expect("read").value.len(), 2);
}

fn member(id: &str, state: &str) -> Member {
    let mut member: Member = serde_json::from_str(&format!(
        r#"{{"id":"{id}","started_at":"2026-11-23T10:00:00Z"}}"#
    ))
    .expect("a member");
    member.state = state.to_string();
    member
}

/// A running announcement is alive, a stopped one is not; both are listed, stamped, after a reopen.
#[tokio::test]
async fn members_are_alive_until_they_stop_and_survive_a_reopen() {
    let dir = TempDir::new().expect("a temporary directory");
    let store = open(&dir, 1_000);
    store
        .announce(&member("b", "running"))
        .await
        .expect("announced");
    store
        .announce(&member("a", "running"))
        .await
        .expect("announced");
    store
        .announce(&member("a", "stopped"))
        .await
        .expect("announced");
    drop(store);
    let members = open(&dir, 1_000).members().await.expect("read").value;
    let seen: Vec<(&str, bool, bool)> = members
        .iter()
        .map(|m| (m.id.as_str(), m.alive, m.seen_at.is_some()))
        .collect();
    assert_eq!(seen, [("a", false, true), ("b", true, true)]);
}

/// A trigger claimed at a time later than a pending scheduled tick leaves that tick claimable, shares the
/// job's lease (`overlap: skip`) and its fence, and is claimed once; a retry attempt likewise.
#[tokio::test]
async fn series_have_their_own_claims_and_share_lease_and_fence() {
    let (_dir, store) = store(60_000);
    let far = chrono::Utc::now().timestamp_millis() + 60_000;
    let trigger =
        |worker: &str| request(worker, 5_000).in_series(Series::Trigger("t1".into()), Tick(far));
    let first = won(store.claim_many(&[trigger("a")]).await.remove(0));
    let again = store.claim_many(&[trigger("b")]).await.remove(0);
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "{again:?}"
    );
    // The scheduled tick before it is busy (one lease), not claimed.
    let busy = claim(&store, "c", 1_000).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }), "{busy:?}");
    store.release(&first).await;
    let scheduled = won(claim(&store, "c", 1_000).await);
    assert!(scheduled.token > first.token, "the fence is shared");
    store.release(&scheduled).await;
    let retry = request("d", 1_000).in_series(Series::Retry(1), Tick(far));
    let retried = won(store.claim_many(&[retry]).await.remove(0));
    assert!(retried.token > scheduled.token);
    // A one-off claim past its window is refused.
    store.release(&retried).await;
    let late = request("e", 1_000).in_series(Series::Retry(2), Tick(1));
    let refused = store.claim_many(&[late]).await.remove(0);
    assert!(
        matches!(refused, ClaimOutcome::AlreadyClaimed { by: None }),
        "{refused:?}"
    );
}

/// Sets the fence counter of `job` to `fence`, as a claim of a far-off tick would have left it.
async fn plant_fence(store: &EmbeddedStore, fence: u64) {
    let fence = i64::try_from(fence).expect("an INTEGER");
    store
        .write(move |_, transaction| {
            transaction.execute(
                "INSERT OR REPLACE INTO fences (key, token) VALUES ('redcron:{job}:fence', ?1)",
                [fence],
            )
        })
        .await
        .expect("planted");
}

/// Issue 20, finding 1, on the embedded store: tokens past 2^53 rise by exactly one; at 2^63 − 1 the next
/// claim is refused ([`Refusal::TokenLimit`]) instead of given the same token again (the counter used to
/// saturate at `i64::MAX` while the lease carried 2^63).
#[tokio::test]
async fn tokens_are_exact_to_their_bound_and_refused_past_it() {
    let (_dir, store) = store(60_000);
    let now = chrono::Utc::now().timestamp_millis();
    plant_fence(&store, 10_413_792_000_569_000).await;
    let mut tokens = Vec::new();
    for (n, worker) in ["a", "b", "c"].into_iter().enumerate() {
        let lease = won(claim(&store, worker, now + n as i64).await);
        tokens.push(lease.token);
        store.release(&lease).await;
    }
    assert_eq!(
        tokens,
        [
            10_413_792_000_569_001,
            10_413_792_000_569_002,
            10_413_792_000_569_003
        ]
    );
    plant_fence(&store, MAX_TOKEN - 1).await;
    let last = won(claim(&store, "d", now + 3).await);
    assert_eq!(last.token, MAX_TOKEN);
    store.release(&last).await;
    let past = claim(&store, "e", now + 4).await;
    assert!(
        matches!(
            past,
            ClaimOutcome::Refused(Refusal::TokenLimit {
                fence: MAX_TOKEN,
                ..
            })
        ),
        "{past:?}"
    );
    // Nothing was written: the job is free, and its counter stands at the bound.
    let other = claim(&store, "f", now + 5).await;
    assert!(matches!(other, ClaimOutcome::Refused(_)), "{other:?}");
}

/// Issue 20, finding 1, on the embedded store: a tick more than an hour ahead of this host's clock is
/// refused ([`Refusal::TickAhead`]), in the schedule and in a trigger's series, and moves no token.
#[tokio::test]
async fn a_tick_far_ahead_of_the_hosts_clock_is_refused() {
    let (_dir, store) = store(60_000);
    let far: DateTime<chrono::Utc> = "2300-01-01T00:00:00Z".parse().expect("a time");
    let far = far.timestamp_millis();
    let trigger = request("b", far).in_series(Series::Trigger("t1".into()), Tick(far + 30_000));
    for outcome in [
        claim(&store, "a", far).await,
        store.claim_many(&[trigger]).await.remove(0),
    ] {
        assert!(
            matches!(outcome, ClaimOutcome::Refused(Refusal::TickAhead { tick: Tick(t), .. }) if t == far),
            "{outcome:?}"
        );
    }
    let now = chrono::Utc::now().timestamp_millis();
    let lease = won(claim(&store, "c", now).await);
    assert_eq!(lease.token, token_floor(Tick(now)));
}
