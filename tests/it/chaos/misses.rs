//! Why a tick did not run: the *explained miss* rules of the checker, applied to one tick.
//!
//! A claim that was in flight when its worker was paused or killed is **not** an explanation: the
//! protocol lets the others wait out a dead contender's lease (within the misfire grace) and never
//! counts a claim on a minority as taken. A missed tick is explained only by evidence, either of the
//! tick as a whole:
//! - **won, never started**: a worker logged `tick.won` for it and was killed, or paused, before it
//!   logged `run.started` (a holder never starts a job once its lease's deadline has passed, and nobody
//!   else may be granted the tick);
//! - **granted to a claimant that died mid-claim**: the nodes' append-only files ([`super::claims`])
//!   show the tick confirmed on a majority for one claimant, whose worker never logged `tick.won` for it
//!   and was killed or paused while it raced the tick (a grant that reached the nodes but not the log);
//!
//! or of **every** worker `w`, at its race time `r` (the real time at which `w`'s clock reads the tick):
//! - *down*: no process of `w` was up (after its `worker.started`) and unpaused during `[r − 0.5 s,
//!   r + 1.5 s]` (killed, paused, or restarting in a rollout);
//! - *clock step*: `r` is within a step of `w`'s clock (`w` skips or repeats ticks around it);
//! - *held* (only if `w`'s process at `r` runs the job with `overlap: skip`, whose lease is one key per
//!   job): at `r` that key was held for another tick, on a majority — by a run of a process that also
//!   ran the job with `overlap: skip` (from its `tick.won` until its `run.finished`; if its worker was
//!   paused or killed during the run, until at least that moment + TTL), by a ghost contender whose
//!   lease reached a majority (until its TTL), or by a skip-configured process paused or killed while it
//!   raced another tick (until that moment + TTL). In a rollout, a worker on `overlap: allow` takes a
//!   key of its own per tick, so nothing of the sort excuses it;
//! - *still racing*: `w` logged `tick.skipped: overlap` for this tick while the claim of its previous
//!   tick was still going on (its outcome arrived after `r` − 0.1 s), and some fault was active
//!   during that claim (a node unusable or stalled, a worker paused or killed);
//! - *later tick claimed*: a later tick of the job was claimed before `r` + 0.8 s (by a worker whose
//!   clock is ahead): claims only grow, so this tick can no longer be claimed;
//! - *no quorum for the whole grace*: `w` gave up with `tick.skipped: no_quorum` no earlier than the
//!   end of the tick's misfire grace less one backoff, and at each of its attempts that failed for want
//!   of a quorum (`tick.retrying`/`tick.skipped` with reason `no_quorum`) a majority of the 5 nodes was
//!   unusable — killed or hung (and for 2 s after), the proxied node while the proxy is degraded (and
//!   for 1 s after), any node during a stall the probe measured, and any node that confirmed this tick
//!   for another claimant (a node confirms one claimant per tick, for ever).
//!
//! The table names one cause per explained miss: the first of *won, never started*, *granted to a
//! claimant that died*, *held by a paused or crashed holder*, *held by a ghost*, *held by another run*,
//! *still racing*, *no quorum* (planned), *no quorum* (measured stalls), *later tick claimed*, *no live
//! worker*, that applies.

use std::collections::BTreeSet;

use super::checker::{Input, JobSpec};
use super::claims::{worker_of, Confirms};
use super::facts::{Facts, Run, NEVER};
use super::plan::{NODES, WORKERS};
use super::report::show_time;

/// A claim takes at most about this long (rounds, retries): a worker paused this long after its race may
/// have been mid-claim, and an attempt's outcome is logged at most this long after it began.
const CLAIM_MS: i64 = 1_500;
/// A worker that finds no quorum retries with backoff (up to 2 s) until the tick's misfire grace ends: its
/// last attempt ends at most this long before the grace does.
const GIVE_UP_SLACK_MS: i64 = 2_500;

/// An interval during which the job's single lease key may have been held for another tick, and by what.
#[derive(Debug, Clone)]
pub struct Hold {
    tick: i64,
    from: i64,
    to: i64,
    kind: HoldKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldKind {
    Run,
    Disturbed,
    Ghost,
}

/// What one missed tick is judged by.
pub struct Evidence<'a> {
    pub facts: &'a Facts,
    pub job: &'a JobSpec,
    pub runs: &'a [&'a Run],
    pub holds: &'a [Hold],
    pub confirms: &'a Confirms,
}

/// The holds of the job's single lease key (`overlap: skip`), per the *held* rule.
pub fn holds(input: &Input<'_>, facts: &Facts, job: &JobSpec, runs: &[&Run]) -> Vec<Hold> {
    let ttl = input.ttl_ms;
    let mut holds: Vec<Hold> = runs
        .iter()
        .filter(|run| facts.skips(run.instance, job))
        .map(|run| {
            let life = &facts.lives[run.instance];
            let natural = run.finished_at;
            let disturbances = life.disturbances_in(run.won_at - 200, natural.unwrap_or(NEVER));
            let (to, kind) = match disturbances.iter().max() {
                Some(&last) => (
                    natural.unwrap_or(i64::MIN).max(last + ttl) + 300,
                    HoldKind::Disturbed,
                ),
                None if run.run_id.is_none() && natural.is_none() => {
                    (run.won_at + ttl + 300, HoldKind::Run)
                }
                None => (natural.map_or(NEVER, |f| f + 300), HoldKind::Run),
            };
            Hold {
                tick: run.tick,
                from: run.won_at - 200,
                to,
                kind,
            }
        })
        .collect();
    holds.extend(
        facts
            .ghosts
            .iter()
            .filter(|g| g.job == job.name && g.skip_key && g.leased.len() > NODES / 2)
            .map(|g| Hold {
                tick: g.tick,
                from: g.at - 100,
                to: g.at + g.ttl_ms as i64 + 300,
                kind: HoldKind::Ghost,
            }),
    );
    // A skip-configured process paused or killed while racing: its lease may hold the key until its TTL.
    for (instance, life) in facts.lives.iter().enumerate() {
        if !facts.skips(instance, job) {
            continue;
        }
        for p in life.stops.iter().map(|&(s, _)| s).chain(life.killed) {
            let offset = facts.offset_at(life.worker, p);
            let tick = (p + offset).div_euclid(job.period_ms) * job.period_ms;
            let race = facts.race_time(life.worker, tick);
            let logged = !facts.logged(instance, &job.name, tick).is_empty();
            if p - race <= CLAIM_MS && life.ready <= race && !logged {
                holds.push(Hold {
                    tick,
                    from: race - 100,
                    to: p + ttl + 300,
                    kind: HoldKind::Disturbed,
                });
            }
        }
    }
    holds
}

/// Whether a miss of `tick` is explained: `Ok(reason)`, or `Err(what each worker could have done)`.
pub fn explain_miss(e: &Evidence<'_>, tick: i64) -> Result<String, String> {
    let facts = e.facts;
    for run in e
        .runs
        .iter()
        .filter(|r| r.tick == tick && r.run_id.is_none())
    {
        if facts.lives[run.instance].disturbed_in(run.won_at - 500, run.won_at + CLAIM_MS) {
            return Ok(
                "won by a worker that was killed or paused before it started the job".to_string(),
            );
        }
    }
    if let Some(reason) = granted_to_the_dead(e, tick) {
        return Ok(reason);
    }
    let mut reasons: Vec<Result<&'static str, String>> = Vec::new();
    for worker in 0..WORKERS {
        reasons.push(excuse(e, worker, tick));
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
    let category = [
        (
            "held by a paused or crashed holder",
            "a paused or crashed holder kept the lease until its TTL",
        ),
        (
            "held by a ghost",
            "a ghost contender's lease of another tick held the job (overlap: skip)",
        ),
        (
            "held by another run",
            "another run held the job (overlap: skip)",
        ),
        (
            "still racing the previous tick",
            "a worker still racing the previous tick (a slow claim under faults) skipped it",
        ),
        (
            "no quorum",
            "no quorum of Redis nodes at any attempt within the grace",
        ),
        (
            "nodes stalled",
            "no quorum within the grace: a majority of nodes stalled (measured by the probe, not planned)",
        ),
        (
            "later tick claimed first",
            "missed by the worker whose clock is ahead, which then claimed a later tick first",
        ),
    ]
    .iter()
    .find(|(kind, _)| kinds.contains(kind))
    .map_or("no live worker with a usable clock", |(_, category)| {
        category
    });
    Ok(category.to_string())
}

/// The tick was confirmed on a majority for a claimant whose worker never logged `tick.won` for it, and
/// was killed or paused while racing it.
fn granted_to_the_dead(e: &Evidence<'_>, tick: i64) -> Option<String> {
    let facts = e.facts;
    for claimant in e.confirms.granted(&e.job.name, tick) {
        let Some(worker) = worker_of(claimant) else {
            continue;
        };
        let won = e.runs.iter().any(|r| r.tick == tick && r.worker == worker);
        let race = facts.race_time(worker, tick);
        let died = facts.instances_of(worker).any(|(_, life)| {
            life.ready <= race && life.disturbed_in(race - 500, race + CLAIM_MS.max(e.job.grace_ms))
        });
        if !won && died {
            return Some(format!(
                "granted to a claimant of w{worker} that was killed or paused mid-claim (confirmed on a \
                 majority of the nodes' AOF, no tick.won)"
            ));
        }
    }
    None
}

/// Why `worker` could not run `tick`, or what it could have done.
fn excuse(e: &Evidence<'_>, worker: usize, tick: i64) -> Result<&'static str, String> {
    let facts = e.facts;
    let r = facts.race_time(worker, tick);
    let (a, b) = (r - 500, r + CLAIM_MS);
    let Some((instance, _)) = facts
        .instances_of(worker)
        .find(|(_, life)| life.running_throughout(a, b))
    else {
        let paused = facts
            .instances_of(worker)
            .any(|(_, life)| life.paused_in(a, b) && life.killed.is_none_or(|k| k > b));
        return Ok(if paused { "paused" } else { "down" });
    };
    if facts.near_clock_step(worker, r) {
        return Ok("clock step");
    }
    if facts.skips(instance, e.job) {
        if let Some(hold) = e
            .holds
            .iter()
            .find(|h| h.tick != tick && h.from <= r && r <= h.to)
        {
            return Ok(match hold.kind {
                HoldKind::Run => "held by another run",
                HoldKind::Disturbed => "held by a paused or crashed holder",
                HoldKind::Ghost => "held by a ghost",
            });
        }
    }
    if facts.still_racing(instance, &e.job.name, tick, r) {
        return Ok("still racing the previous tick");
    }
    if e.runs
        .iter()
        .any(|other| other.tick > tick && other.won_at <= r + 800)
    {
        return Ok("later tick claimed first");
    }
    if let Some(planned) = no_quorum_throughout(e, instance, worker, tick, r) {
        return Ok(if planned {
            "no quorum"
        } else {
            "nodes stalled"
        });
    }
    let logged = facts.logged(instance, &e.job.name, tick);
    Err(format!(
        "w{worker} (process #{instance}, config v{}) could have run it at {} (logged: {})",
        facts.lives[instance].config,
        show_time(r),
        if logged.is_empty() {
            "nothing".into()
        } else {
            logged.join(", ")
        }
    ))
}

/// The *no quorum for the whole grace* rule: `Some(planned)` if it holds.
fn no_quorum_throughout(
    e: &Evidence<'_>,
    instance: usize,
    worker: usize,
    tick: i64,
    r: i64,
) -> Option<bool> {
    let facts = e.facts;
    let job = &e.job.name;
    let gave_up = *facts
        .logged_at(instance, job, tick, "tick.skipped:no_quorum")
        .first()?;
    if gave_up < r + e.job.grace_ms - GIVE_UP_SLACK_MS {
        return None;
    }
    let taken = e.confirms.taken_from(job, tick, worker);
    let mut attempts = facts.logged_at(instance, job, tick, "tick.retrying:no_quorum");
    attempts.push(gave_up);
    let mut planned = true;
    for end in attempts {
        planned &= facts.no_quorum_in(end - CLAIM_MS, end, &taken)?;
    }
    Some(planned)
}
