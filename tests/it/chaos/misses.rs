//! Why a tick did not run: the *explained miss* rules of the checker, applied to one tick.
//!
//! A tick that did not run is explained if the timeline shows faults that could have prevented it:
//! - **claimed by a worker paused mid-claim**: some worker process was paused or killed around the
//!   moment it raced this tick and had logged no outcome for it (or logged `tick.won` and no run): its
//!   claim may have reached the nodes and consumed the tick, or its keys blocked the others;
//! - or **every** worker `w` was unable to run it at its race time `r` (the real time at which `w`'s
//!   cluster time — its clock plus its measured offset to the nodes' clocks — reads the tick), for one
//!   of these reasons:
//!   - *down*: no process of `w` was up (after its `worker.started`) and unpaused during `[r − 0.5 s,
//!     r + 1.5 s]`;
//!   - *clock step*: `r` is within a step of `w`'s clock, or of the measurement that corrects it (`w`
//!     skips or repeats ticks around it);
//!   - *no quorum*: a majority of the 5 nodes was unusable at some instant of `[r − 0.5 s, r + 1.5 s]`,
//!     where a node is unusable while killed or hung and for 2 s after it is back, the proxied node
//!     while the proxy is slow or flaky and for 1 s after, and any node during a stall that the
//!     harness's probe measured (an answer slower than 50 ms, widened by 0.1 s each side: on a shared
//!     disk one slow fsync stalls every node at once, a fault the plan did not inject but the machine
//!     did; the table says when a miss needed such a stall to be explained);
//!   - *held* (`overlap: skip` jobs, whose lease is one key per job): at `r` the job's lease was held
//!     for another tick — from that run's `tick.won` until its `run.finished`; if its worker was paused or killed during the run,
//!     until at least that moment + TTL (the keys outlive a silent holder); and for a claimant paused
//!     mid-claim, from its race until its pause + TTL;
//!   - *still racing*: `w` logged `tick.skipped: overlap` for this tick while the claim of its previous
//!     tick was still going on (its outcome arrived after `r` − 0.1 s), and some fault was active
//!     during that claim (a node unusable or stalled, a worker paused or killed): the worker marks an
//!     `overlap: skip` job busy from the moment it races a tick, and a claim slowed down by retries and
//!     timeouts can outlast the period. (Without a fault a claim takes milliseconds, so a claim that
//!     hangs is not excused);
//!   - *later tick claimed*: a later tick of the job was claimed before `r` + 0.8 s (by a worker whose
//!     cluster time is ahead, after a step of its clock): claims only grow, so this tick can no longer
//!     be claimed.
//!
//! The table names one cause per explained miss: the first of *held by a paused or crashed holder*,
//! *held by another run*, *still racing*, *no quorum* (planned), *no quorum* (measured stalls), *later tick
//! claimed*, *no live worker*, that applies to some worker.
//!
//! Nothing else explains a miss: a `tick.skipped: no_quorum` logged while the timeline shows a majority
//! of nodes usable, or a `tick.lost: busy` while no earlier run could hold the job, is a failure.

use std::collections::BTreeSet;

use super::checker::{Input, JobSpec};
use super::facts::{Facts, Run, NEVER};
use super::plan::WORKERS;
use super::report::show_time;

/// A claim takes at most about this long (rounds, retries): a worker paused this long after its race may
/// have been mid-claim.
const CLAIM_MS: i64 = 1_500;

/// An interval during which the job's lease may have been held for another tick, and by what.
#[derive(Debug, Clone)]
pub struct Hold {
    tick: i64,
    from: i64,
    to: i64,
    what: String,
}

/// The `overlap: skip` job's lease holds: runs (and wins that never ran), per the *held* rule.
pub fn holds(input: &Input<'_>, facts: &Facts, job: &JobSpec, runs: &[&Run]) -> Vec<Hold> {
    let mut holds: Vec<Hold> = runs
        .iter()
        .map(|run| {
            let life = &facts.lives[run.instance];
            let natural = run.finished_at;
            let until = natural.unwrap_or(NEVER);
            let disturbances = life.disturbances_in(run.won_at - 200, until);
            let (to, how) = match disturbances.iter().max() {
                Some(&last) => (
                    natural.unwrap_or(i64::MIN).max(last + input.ttl_ms) + 300,
                    "paused or crashed holder",
                ),
                None if run.run_id.is_none() && natural.is_none() => {
                    (run.won_at + input.ttl_ms + 300, "won, never started")
                }
                None => (
                    natural.map_or(NEVER, |f| f + 300),
                    "previous run still running",
                ),
            };
            Hold {
                tick: run.tick,
                from: run.won_at - 200,
                to,
                what: format!("{how} (w{}, tick {})", run.worker, show_time(run.tick)),
            }
        })
        .collect();
    holds.extend(phantom_claims(input, facts, job));
    holds
}

/// Claims that may have been in flight when their worker was paused or killed, per the *claimed by a
/// worker paused mid-claim* rule: from the race until the pause + TTL.
pub fn phantom_claims(input: &Input<'_>, facts: &Facts, job: &JobSpec) -> Vec<Hold> {
    let mut found = Vec::new();
    for (instance, life) in facts.lives.iter().enumerate() {
        let moments: Vec<i64> = life
            .stops
            .iter()
            .map(|&(s, _)| s)
            .chain(life.killed)
            .collect();
        for p in moments {
            // The latest tick this worker's cluster time had reached at p.
            let offset = facts.skew_at(life.worker, p);
            let tick = (p + offset).div_euclid(job.period_ms) * job.period_ms;
            let race = facts.race_time(life.worker, tick);
            let logged = !facts.logged(instance, &job.name, tick).is_empty();
            if p - race <= CLAIM_MS && life.ready <= race && !logged {
                found.push(Hold {
                    tick,
                    from: race - 100,
                    to: p + input.ttl_ms + 300,
                    what: format!(
                        "w{} paused or killed mid-claim (tick {})",
                        life.worker,
                        show_time(tick)
                    ),
                });
            }
        }
    }
    found
}

/// Whether a miss of `tick` is explained: `Ok(reason)`, or `Err(what each worker could have done)`.
pub fn explain_miss(
    facts: &Facts,
    job: &JobSpec,
    tick: i64,
    runs: &[&Run],
    holds: &[Hold],
    phantoms: &[Hold],
) -> Result<String, String> {
    // Claimed by a worker paused mid-claim (or that won and was stopped before starting the job).
    if phantoms.iter().any(|h| h.tick == tick) {
        return Ok("claim consumed by a worker paused or killed mid-claim".to_string());
    }
    for run in runs.iter().filter(|r| r.tick == tick && r.run_id.is_none()) {
        if facts.lives[run.instance].disturbed_in(run.won_at - 500, run.won_at + CLAIM_MS) {
            return Ok("won by a worker paused or killed before it started the job".to_string());
        }
    }
    let mut reasons: Vec<Result<&'static str, String>> = Vec::new();
    for worker in 0..WORKERS {
        let r = facts.race_time(worker, tick);
        let (a, b) = (r - 500, r + CLAIM_MS);
        let reason = if !facts
            .instances_of(worker)
            .any(|(_, life)| life.running_throughout(a, b))
        {
            if facts
                .instances_of(worker)
                .any(|(_, life)| life.paused_in(a, b) && life.killed.is_none_or(|k| k > b))
            {
                Ok("paused")
            } else {
                Ok("down")
            }
        } else if facts.near_clock_step(worker, r) {
            Ok("clock step")
        } else if let Some(hold) = holds
            .iter()
            .find(|h| h.tick != tick && h.from <= r && r <= h.to)
        {
            if hold.what.starts_with("previous run") {
                Ok("held by another run")
            } else {
                Ok("held by a paused or crashed holder")
            }
        } else if facts
            .instances_of(worker)
            .any(|(instance, _)| facts.still_racing(instance, &job.name, tick, r))
        {
            Ok("still racing the previous tick")
        } else if runs
            .iter()
            .any(|other| other.tick > tick && other.won_at <= r + 800)
        {
            Ok("later tick claimed first")
        } else if let Some(planned) = facts.no_quorum_in(a, b) {
            Ok(if planned {
                "no quorum"
            } else {
                "nodes stalled"
            })
        } else {
            let logged: Vec<String> = facts
                .instances_of(worker)
                .flat_map(|(instance, _)| facts.logged(instance, &job.name, tick))
                .collect();
            Err(format!(
                "w{worker} could have run it at {} (logged: {})",
                show_time(r),
                if logged.is_empty() {
                    "nothing".into()
                } else {
                    logged.join(", ")
                }
            ))
        };
        reasons.push(reason);
    }
    let errors: Vec<String> = reasons.iter().filter_map(|r| r.clone().err()).collect();
    if !errors.is_empty() {
        let others: Vec<String> = reasons
            .iter()
            .enumerate()
            .filter_map(|(w, r)| r.as_ref().ok().map(|why| format!("w{w} {why}")))
            .collect();
        return Err(format!("{}; {}", errors.join("; "), others.join(", ")));
    }
    let kinds: BTreeSet<&str> = reasons
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    let category = if kinds.contains("held by a paused or crashed holder") {
        "a paused or crashed holder kept the lease until its TTL"
    } else if kinds.contains("held by another run") {
        "another run held the job (overlap: skip)"
    } else if kinds.contains("still racing the previous tick") {
        "a worker still racing the previous tick (a slow claim under faults) skipped it"
    } else if kinds.contains("no quorum") {
        "no quorum of Redis nodes"
    } else if kinds.contains("nodes stalled") {
        "no quorum: a majority of nodes stalled (measured by the probe, not planned)"
    } else if kinds.contains("later tick claimed first") {
        "missed by a worker whose cluster time was ahead, which then claimed a later tick first"
    } else {
        "no live worker with a usable clock"
    };
    Ok(category.to_string())
}
