//! The claim table of [`crate::lock::decision`] run through the Lua scripts on a real Redis node: each
//! case's keys are written on the node, then `ACQUIRE` (and `CONFIRM` after it, where it grants) answers
//! the claim; a case the rule refuses for a pause or a record is also put to `CONFIRM` alone, which checks
//! those again in round 2. The scripts and [`crate::lock::decision::decide`] must give every case the same
//! answer.

use std::time::Duration;

use redis::Connection;
use testkit::RedisCluster;

use super::reply::{parse_round1, parse_round2, Round1, Round2};
use super::scripts::{ACQUIRE, CONFIRM};
use crate::lock::decision::cases::{table, Case, Expect};
use crate::lock::decision::decide;
use crate::lock::keys::{attempt_value, claim_keys, Holder};

const PREFIX: &str = "rc-decision";
const TTL: Duration = Duration::from_secs(30);

/// Writes the case's pause, record and lease on the node (after clearing it); `lease` overrides the
/// case's lease value. Returns the claim's four keys.
fn plant(node: &mut Connection, case: &Case, lease: Option<&str>) -> [String; 4] {
    let request = &case.request;
    let keys = claim_keys(
        PREFIX,
        &request.job,
        request.tick,
        request.overlap,
        &request.series,
    );
    let [lease_key, _, claim_key, paused_key] = &keys;
    redis::cmd("FLUSHALL").exec(node).expect("FLUSHALL");
    if let Some(pause) = &case.pause {
        redis::cmd("SET")
            .arg(paused_key)
            .arg(pause)
            .exec(node)
            .expect("SET pause");
    }
    if let Some(record) = &case.record {
        redis::cmd("SET")
            .arg(claim_key)
            .arg(record)
            .exec(node)
            .expect("SET record");
    }
    let planted = lease.or(case.lease.as_ref().map(|(value, ..)| value.as_str()));
    if let Some(value) = planted {
        let left = case.lease.as_ref().map_or(TTL, |(_, left, _)| *left);
        redis::cmd("SET")
            .arg(lease_key)
            .arg(value)
            .arg("PX")
            .arg(left.as_millis() as u64)
            .exec(node)
            .expect("SET lease");
    }
    keys
}

/// The one claim's reply of a batch script's replies.
fn first(replies: redis::Value) -> redis::Value {
    match replies {
        redis::Value::Array(mut replies) if replies.len() == 1 => replies.remove(0),
        other => panic!("not one claim's reply: {other:?}"),
    }
}

/// Round 2 of the case's claim by the attempt `value`, for `token`.
fn confirm(node: &mut Connection, case: &Case, keys: &[String; 4], value: &str) -> Round2 {
    let request = &case.request;
    let reply = CONFIRM
        .key(keys.as_slice())
        .arg(value)
        .arg(request.tick.as_millis().max(1) * 1000)
        .arg(request.tick.as_millis())
        .arg(&request.claimant)
        .arg(request.not_after.map_or(0, |t| t.as_millis()))
        .arg(request.record_expires_at().unwrap_or(0))
        .invoke(node)
        .expect("CONFIRM");
    parse_round2(first(reply))
}

/// What the scripts answer the case: round 1, and round 2 after a grant.
fn through_the_scripts(node: &mut Connection, case: &Case) -> Result<Expect, String> {
    let request = &case.request;
    let keys = plant(node, case, None);
    let value = attempt_value(&request.claimant, request.tick, "f", &request.series);
    let reply = ACQUIRE
        .key(keys.as_slice())
        .arg(&value)
        .arg(TTL.as_millis() as u64)
        .arg(request.tick.as_millis())
        .arg(&request.claimant)
        .arg(request.not_after.map_or(0, |t| t.as_millis()))
        .invoke(node)
        .expect("ACQUIRE");
    Ok(match parse_round1(first(reply)) {
        Round1::Ok { .. } => match confirm(node, case, &keys, &value) {
            Round2::Ok => Expect::Take,
            other => return Err(format!("round 1 granted, round 2 answered {other:?}")),
        },
        Round1::Paused(_) => Expect::Paused,
        Round1::Claimed(_) => Expect::Claimed,
        Round1::Ahead { .. } => Expect::Ahead,
        Round1::Busy { value, .. } => {
            if Holder::from_value(&value).contends_for(request.tick, &request.series) {
                Expect::Contended
            } else {
                Expect::Busy
            }
        }
        Round1::Failed(why) => return Err(why),
    })
}

/// What `CONFIRM` alone answers the case, with the claim's own attempt holding the lease (as after a round
/// 1 that passed before the pause or the record reached the node).
fn confirm_alone(node: &mut Connection, case: &Case) -> Result<Expect, String> {
    let request = &case.request;
    let value = attempt_value(&request.claimant, request.tick, "f", &request.series);
    let keys = plant(node, case, Some(&value));
    Ok(match confirm(node, case, &keys, &value) {
        Round2::Ok => Expect::Take,
        Round2::Paused(_) => Expect::Paused,
        Round2::Claimed(_) => Expect::Claimed,
        other => return Err(format!("{other:?}")),
    })
}

/// Every case of the table the scripts can hold gets the rule's answer from them.
#[test]
fn the_scripts_decide_every_case_as_the_rule_does() {
    let redis = RedisCluster::start(1);
    let mut node = redis.connection(0);
    let now_ms = chrono::Utc::now().timestamp_millis();
    let cases: Vec<Case> = table(now_ms)
        .into_iter()
        .filter(|case| case.on_redis)
        .collect();
    assert!(
        cases.len() >= 20,
        "the table lost its cases: {}",
        cases.len()
    );
    let mut disagree = Vec::new();
    for case in &cases {
        let rule = Expect::of(&decide(&case.request, &case.seen(now_ms), TTL));
        let scripts = through_the_scripts(&mut node, case);
        if rule != Some(case.expect) || scripts.as_ref().ok() != Some(&case.expect) {
            disagree.push(format!(
                "{}: expected {:?}, the rule said {rule:?}, the scripts {scripts:?}",
                case.name, case.expect
            ));
        }
        if matches!(case.expect, Expect::Paused | Expect::Claimed) {
            let round2 = confirm_alone(&mut node, case);
            if round2.as_ref().ok() != Some(&case.expect) {
                disagree.push(format!(
                    "{} (round 2): expected {:?}, CONFIRM said {round2:?}",
                    case.name, case.expect
                ));
            }
        }
    }
    assert!(disagree.is_empty(), "{}", disagree.join("\n"));
}
