//! How a snapshot of a claim's keys answers it ([`super::decide`]): the one rule's answers
//! ([`crate::lock::decision`]) on what etcd reads.

use std::time::Duration;

use super::{decide, Seen, Snapshot};
use crate::lock::{ClaimOutcome, ClaimRequest, Overlap, Pause, Series};
use crate::schedule::Tick;

/// The end of a one-off claim's window that has not come (2100-01-01): windows end on this host's clock.
const OPEN_WINDOW: Tick = Tick(4_102_444_800_000);

fn request(tick: i64) -> ClaimRequest {
    ClaimRequest::new("w1", "job", Tick(tick), Overlap::Skip, "f")
}

fn key(value: &str) -> Option<Seen> {
    Some(Seen {
        value: value.to_string(),
        mod_revision: 7,
    })
}

fn answer(
    request: &ClaimRequest,
    claim: Option<Seen>,
    lease: Option<Seen>,
) -> Option<ClaimOutcome> {
    decide(
        request,
        &Snapshot {
            claim,
            lease,
            ..Snapshot::default()
        },
        Duration::from_millis(100),
        &|value| value == "w9/r|1|1000|f",
    )
}

#[test]
fn a_free_job_may_be_taken() {
    assert!(answer(&request(1_000), None, None).is_none());
    assert!(answer(&request(2_000), key("1000 w2/a|1|1000|f"), None).is_none());
}

#[test]
fn this_tick_or_a_later_one_claimed_by_another_is_final() {
    let r = request(2_000);
    for record in ["2000 w2/b|1|2000|f", "3000 w2/b|1|3000|f", "garbage"] {
        let outcome = answer(&r, key(record), None);
        assert!(
            matches!(outcome, Some(ClaimOutcome::AlreadyClaimed { .. })),
            "{record}: {outcome:?}"
        );
    }
    match answer(&r, key("3000 w2/b|1|3000|f"), None) {
        Some(ClaimOutcome::AlreadyClaimed { by: Some(by) }) => {
            assert_eq!((by.worker.as_str(), by.tick), ("w2", Some(Tick(3_000))));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn our_own_record_and_lease_are_ours_to_go_on_from() {
    let r = request(2_000);
    let ours = format!("{}|1|2000|f", r.claimant);
    let record = format!("2000 {ours}");
    assert!(answer(&r, key(&record), key(&ours)).is_none());
}

#[test]
fn another_ticks_run_makes_the_job_busy_and_a_same_tick_holder_contended() {
    let r = request(2_000);
    assert!(matches!(
        answer(&r, key("1000 w2/b|1|1000|f"), key("w2/b|1|1000|f")),
        Some(ClaimOutcome::Busy { .. })
    ));
    assert!(matches!(
        answer(&r, None, key("w3/c|4|2000|f")),
        Some(ClaimOutcome::Contended { .. })
    ));
}

#[test]
fn a_lease_this_process_released_is_free_while_its_revoke_waits() {
    let r = request(2_000);
    assert!(answer(&r, key("1000 w9/r|1|1000|f"), key("w9/r|1|1000|f")).is_none());
}

#[test]
fn a_pause_refuses_before_anything_else() {
    let r = request(2_000);
    let pause = Pause {
        until: None,
        by: "ops@vm".to_string(),
        reason: "migration".to_string(),
    };
    let snapshot = Snapshot {
        paused: key(&pause.to_value()),
        ..Snapshot::default()
    };
    match decide(&r, &snapshot, Duration::from_millis(100), &|_| false) {
        Some(ClaimOutcome::Paused(found)) => assert_eq!(found, pause),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_trigger_is_claimable_only_while_its_request_stands() {
    let r = request(2_000).in_series(Series::Trigger("ab".into()), OPEN_WINDOW);
    let with = |anchor| Snapshot {
        anchor,
        ..Snapshot::default()
    };
    let free = |snapshot: &Snapshot| decide(&r, snapshot, Duration::ZERO, &|_| false);
    assert!(free(&with(key("{}"))).is_none());
    assert!(matches!(
        free(&with(None)),
        Some(ClaimOutcome::AlreadyClaimed { by: None })
    ));
}

#[test]
fn another_series_of_the_same_tick_holding_the_lease_makes_the_job_busy() {
    let retry = request(2_000).in_series(Series::Retry(1), OPEN_WINDOW);
    assert!(matches!(
        answer(&retry, None, key("w3/c|4|2000|f")),
        Some(ClaimOutcome::Busy { .. })
    ));
    assert!(matches!(
        answer(&retry, None, key("w3/c|4|2000|f|retry:1")),
        Some(ClaimOutcome::Contended { .. })
    ));
}

/// The token is `max(fence + 1, tick × 1000)`, as on the other stores: a job without a fence (never
/// claimed, or claimed only by workers that took the revision as the token) starts at the tick's floor,
/// a fence above the floor goes on from itself, a fence that is not a number counts as none, and a
/// token past the bound is refused.
#[test]
fn the_token_is_above_the_fence_and_the_ticks_floor() {
    let tick = Tick(1_800_000_000_000);
    let floor = 1_800_000_000_000_000;
    let with = |fence: Option<&str>| Snapshot {
        fence: fence.and_then(key),
        ..Snapshot::default()
    };
    assert_eq!(with(None).next_token(tick), Ok(floor));
    assert_eq!(with(Some("499")).next_token(tick), Ok(floor));
    assert_eq!(
        with(Some(&(floor + 7).to_string())).next_token(tick),
        Ok(floor + 8)
    );
    assert_eq!(with(Some("garbage")).next_token(tick), Ok(floor));
    let last = crate::lock::keys::MAX_TOKEN.to_string();
    assert!(matches!(
        with(Some(&last)).next_token(tick),
        Err(crate::lock::Refusal::TokenLimit { .. })
    ));
}
