//! One table of claim cases, run through [`super::decide`] here and through the Redis scripts on a real
//! node (`store::redis::decision_tests`): every store decides a claim by the same rule.

use std::time::Duration;

use super::{decide, Anchor, ClaimView, Decision, LeaseSeen, Record};
use crate::lock::keys::attempt_value;
use crate::lock::{ClaimOutcome, ClaimRequest, Overlap, Pause, Series, MAX_TICK_AHEAD};
use crate::schedule::Tick;

/// The answer a case expects, as the scripts can tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    Take,
    Paused,
    Claimed,
    Ahead,
    Busy,
    Contended,
}

impl Expect {
    /// The kind of `decision`.
    pub(crate) fn of(decision: &Decision) -> Option<Expect> {
        Some(match decision {
            Decision::Take => Expect::Take,
            Decision::Answer(ClaimOutcome::Paused(_)) => Expect::Paused,
            Decision::Answer(ClaimOutcome::AlreadyClaimed { .. }) => Expect::Claimed,
            Decision::Answer(ClaimOutcome::Refused(_)) => Expect::Ahead,
            Decision::Answer(ClaimOutcome::Busy { .. }) => Expect::Busy,
            Decision::Answer(ClaimOutcome::Contended { .. }) => Expect::Contended,
            Decision::Answer(_) => return None,
        })
    }
}

/// One case: a request and what the store holds when it is decided.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub name: &'static str,
    pub request: ClaimRequest,
    /// The stored pause's value, standing.
    pub pause: Option<String>,
    /// The stored claim record, as text.
    pub record: Option<String>,
    /// A standing lease: its value, its time left, and whether its claimant may replace it.
    pub lease: Option<(String, Duration, bool)>,
    /// A trigger's request as read.
    pub anchor: Anchor,
    /// Whether the Redis scripts can hold this case (they keep no trigger request, and every lease of
    /// theirs may be replaced by its claimant).
    pub on_redis: bool,
    pub expect: Expect,
}

impl Case {
    /// The case's snapshot, with the store's clock at `now_ms`.
    pub(crate) fn seen(&self, now_ms: i64) -> ClaimView<'_> {
        ClaimView {
            pause: self.pause.as_deref().map(Pause::from_value),
            record: self.record.as_deref().map(Record::parse),
            anchor: self.anchor,
            now_ms,
            check_ahead: true,
            lease: self
                .lease
                .as_ref()
                .map(|(value, left, replaceable)| LeaseSeen {
                    value,
                    left: Some(*left),
                    replaceable: *replaceable,
                }),
        }
    }
}

/// The table, around the store's clock at `now_ms` (its ticks are minutes apart, so a node's clock a
/// moment later decides each case alike).
pub(crate) fn table(now_ms: i64) -> Vec<Case> {
    const MINUTE: i64 = 60_000;
    let tick = Tick(now_ms - now_ms.rem_euclid(1000) - MINUTE);
    let skip = ClaimRequest::new("w1", "job", tick, Overlap::Skip, "f");
    let ours = |at: Tick| attempt_value(&skip.claimant, at, "f", &Series::Schedule);
    let other = |at: Tick| {
        let other = ClaimRequest::new("w2", "job", at, Overlap::Skip, "f");
        attempt_value(&other.claimant, at, "f", &Series::Schedule)
    };
    let record = |at: Tick, value: String| Some(format!("{} {value}", at.as_millis()));
    let earlier = Tick(tick.as_millis() - MINUTE);
    let later = Tick(tick.as_millis() + MINUTE);
    let far = Tick(now_ms + i64::try_from(MAX_TICK_AHEAD.as_millis()).unwrap_or(0) + 60 * MINUTE);
    let pause = Some("0|ops|maintenance".to_string());
    let lease = |value: String| Some((value, Duration::from_secs(20), true));
    let base = Case {
        name: "",
        request: skip.clone(),
        pause: None,
        record: None,
        lease: None,
        anchor: Anchor::Unchecked,
        on_redis: true,
        expect: Expect::Take,
    };
    let case = |name, change: &dyn Fn(&mut Case)| {
        let mut case = Case {
            name,
            ..base.clone()
        };
        change(&mut case);
        case
    };
    let trigger = skip
        .clone()
        .in_series(Series::Trigger("t1".to_string()), Tick(now_ms + MINUTE));
    let window = |case: &mut Case, end: i64| {
        case.request = skip.clone().in_series(Series::Retry(1), Tick(now_ms + end));
    };
    vec![
        case("a free tick is taken", &|_| {}),
        case("a pause refuses", &|c| {
            c.pause = pause.clone();
            c.expect = Expect::Paused;
        }),
        case("a pause refuses before another's record", &|c| {
            c.pause = pause.clone();
            c.record = record(tick, other(tick));
            c.expect = Expect::Paused;
        }),
        case("another claimant's record of this tick refuses", &|c| {
            c.record = record(tick, other(tick));
            c.expect = Expect::Claimed;
        }),
        case("a later tick's record refuses, even our claimant's", &|c| {
            c.record = record(later, ours(later));
            c.expect = Expect::Claimed;
        }),
        case("an earlier tick's record leaves the tick free", &|c| {
            c.record = record(earlier, other(earlier));
        }),
        case(
            "our claimant's record of this tick is ours to go on from",
            &|c| {
                c.record = record(tick, ours(tick));
                c.lease = lease(ours(tick));
            },
        ),
        case("an unreadable record refuses", &|c| {
            c.record = Some("not a record".to_string());
            c.expect = Expect::Claimed;
        }),
        case("a record with no value refuses", &|c| {
            c.record = Some(format!("{} ", earlier.as_millis()));
            c.expect = Expect::Claimed;
        }),
        case("a bare earlier tick leaves the tick free", &|c| {
            c.record = Some(earlier.as_millis().to_string());
        }),
        case("a bare number of this tick refuses", &|c| {
            c.record = Some(tick.as_millis().to_string());
            c.expect = Expect::Claimed;
        }),
        case("a record's tick past any integer refuses", &|c| {
            c.record = Some(format!("99999999999999999999999 {}", other(tick)));
            c.expect = Expect::Claimed;
        }),
        case(
            "a record's tick below any integer leaves the tick free",
            &|c| {
                c.record = Some(format!("-99999999999999999999999 {}", other(tick)));
            },
        ),
        case("an ended window refuses", &|c| {
            window(c, -5_000);
            c.expect = Expect::Claimed;
        }),
        case("a pause refuses before an ended window", &|c| {
            window(c, -5_000);
            c.pause = pause.clone();
            c.expect = Expect::Paused;
        }),
        case("a window that lasts leaves the tick free", &|c| {
            window(c, 5 * MINUTE);
        }),
        case("a tick far ahead of the store's clock is refused", &|c| {
            c.request = ClaimRequest::new("w1", "job", far, Overlap::Skip, "f");
            c.expect = Expect::Ahead;
        }),
        case("a later record refuses before the clock is read", &|c| {
            c.request = ClaimRequest::new("w1", "job", far, Overlap::Skip, "f");
            c.record = record(Tick(far.as_millis() + MINUTE), other(far));
            c.expect = Expect::Claimed;
        }),
        case("another tick's lease is busy (overlap: skip)", &|c| {
            c.lease = lease(other(earlier));
            c.expect = Expect::Busy;
        }),
        case(
            "another claimant of this tick holding the lease contends",
            &|c| {
                c.lease = lease(other(tick));
                c.expect = Expect::Contended;
            },
        ),
        case(
            "our claimant's lease of an earlier attempt is replaced",
            &|c| {
                c.lease = lease(ours(tick));
            },
        ),
        case(
            "our claimant's lease that it may not replace contends",
            &|c| {
                c.lease = Some((ours(tick), Duration::from_secs(20), false));
                c.on_redis = false;
                c.expect = Expect::Contended;
            },
        ),
        case("a trigger whose request is gone is refused", &|c| {
            c.request = trigger.clone();
            c.anchor = Anchor::Gone;
            c.on_redis = false;
            c.expect = Expect::Claimed;
        }),
        case("a trigger whose request stands is free", &|c| {
            c.request = trigger.clone();
            c.anchor = Anchor::Present;
        }),
    ]
}

/// Every case of the table, decided by [`decide`].
#[test]
fn the_table_is_decided_as_it_expects() {
    let now_ms = chrono::Utc::now().timestamp_millis();
    for case in table(now_ms) {
        let decision = decide(&case.request, &case.seen(now_ms), Duration::from_millis(50));
        assert_eq!(
            Expect::of(&decision),
            Some(case.expect),
            "{}: {decision:?}",
            case.name
        );
    }
}

/// A contended claim waits for the lease's time left, at least the retry delay; a store that cannot tell
/// the time left says the retry delay, and a busy one no time at all.
#[test]
fn a_contended_claim_waits_for_the_lease() {
    let now_ms = 1_000_000_000;
    let table = table(now_ms);
    let contended = table
        .iter()
        .find(|case| case.expect == Expect::Contended && case.on_redis)
        .expect("a contended case");
    let mut seen = contended.seen(now_ms);
    let retry_in = |seen: &ClaimView<'_>, delay| match decide(&contended.request, seen, delay) {
        Decision::Answer(ClaimOutcome::Contended { retry_in, .. }) => retry_in,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        retry_in(&seen, Duration::from_millis(50)),
        Duration::from_secs(20)
    );
    assert_eq!(
        retry_in(&seen, Duration::from_secs(30)),
        Duration::from_secs(30)
    );
    if let Some(lease) = &mut seen.lease {
        lease.left = None;
    }
    assert_eq!(
        retry_in(&seen, Duration::from_millis(50)),
        Duration::from_millis(50)
    );
}

/// A stored record reads as the scripts read it.
#[test]
fn records_parse_as_the_scripts_read_them() {
    assert_eq!(
        Record::parse("5000 w/1|2|5000|f"),
        Record::Claimed {
            tick: Tick(5000),
            value: "w/1|2|5000|f"
        }
    );
    assert_eq!(
        Record::parse("-7"),
        Record::Claimed {
            tick: Tick(-7),
            value: ""
        }
    );
    assert_eq!(
        Record::parse("1 a b"),
        Record::Claimed {
            tick: Tick(1),
            value: "a b"
        }
    );
    for unreadable in ["", " ", "5000 ", "x 1", "+5 v", "5x v", "- v", "\u{fffd}"] {
        assert_eq!(
            Record::parse(unreadable),
            Record::Unreadable,
            "{unreadable:?}"
        );
    }
}
