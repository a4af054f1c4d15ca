//! Why a tick did not run: the *explained miss* rules of the checker, applied to one tick.
//!
//! A claim that was in flight when its worker was paused or killed is **not** an explanation: the
//! protocol lets the others wait out a dead contender's lease (within the tick's window) and never
//! counts a claim on a minority as taken. A missed tick is explained only by evidence, either of the
//! tick as a whole:
//! - **won, never started**: a worker logged `tick.won` for it and was killed, or paused, before it
//!   logged `run.started` (a holder never starts a job once its lease's deadline has passed, and nobody
//!   else may be granted the tick);
//! - **granted to a claimant that died mid-claim**: the nodes' append-only files ([`super::claims`])
//!   show the tick confirmed on a majority for one claimant, whose worker never logged `tick.won` for it
//!   and was killed, paused or told to shut down (it then skips a tick it wins) while it raced the tick —
//!   after its first lease was written (the lease's expiry in the AOF less the TTL), within a claim's
//!   length or the grace (a grant that reached the nodes but not the log);
//!
//! or of **every** worker `w`, at its race time `r` (the real time at which `w`'s cluster time — its
//! clock plus its measured offset to the nodes' clocks — reads the tick):
//! - *down*: no process of `w` was up (after its `worker.started`) and unpaused during `[r − 0.5 s,
//!   r + 1.5 s]` (killed, paused, or restarting in a rollout);
//! - *clock step*: `r` is within a step of `w`'s clock, or of the measurement that corrects it, or a step
//!   lies between the tick and when `w`'s clock would have read it before the step (the step jumped
//!   over the tick: `w` skips or repeats ticks around it);
//! - *clock unmeasured* (last, when nothing above applies): `w`'s process at `r` has not measured its
//!   offset to the store's clock since it started (no `clock.offset` yet) and logged `clock.unmeasured`
//!   before it did, and a majority was out of reach at some instant between its start and `r` (what
//!   kept it from measuring): it does not know its cluster time, so it races nothing — a worker
//!   restarted by a rollout while the one SQL server is killed;
//! - *held* (only if `w`'s process at `r` runs the job with `overlap: skip`, whose lease is one key per
//!   job): at `r` that key was held for another tick, on a majority — by a run of a process that also
//!   ran the job with `overlap: skip` (from its `tick.won` until its `run.finished`; if its worker was
//!   paused or killed during the run, until at least that moment + TTL), by a ghost contender whose
//!   lease reached a majority (until its TTL), or by a skip-configured process paused or killed while it
//!   raced another tick (until that moment + TTL); or `w` logged `tick.lost: busy` naming a holder of
//!   another tick (the nodes' own answer: a contender of an earlier tick that is still retrying, or whose
//!   undo did not reach a hung node, holds the key until its TTL). In a rollout, a worker on
//!   `overlap: allow` takes a key of its own per tick, so nothing of the sort excuses it;
//! - *later tick claimed*: a later tick of the job was claimed before `r` + 0.8 s (by a worker whose
//!   cluster time is ahead, after a step of its clock) — its `tick.won` arrived, or it was granted to a
//!   claimant that died mid-claim, by the time it died: claims only grow, so this tick can no longer be
//!   claimed;
//! - *no majority within the tick's window*: `w` gave up the tick (`tick.skipped` with reason
//!   `no_quorum` or `contended`) at the end of its window — the misfire grace, or the job's next tick if
//!   that comes first, as G4 in `docs/protocol.md` promises — or was told `tick.lost:
//!   later_tick_claimed` after a later tick was claimed (as above: the nodes refuse a tick once a later
//!   one is confirmed); and at each of its attempts that failed (`tick.retrying`/`tick.skipped` with
//!   those reasons; the `tick.lost` that ended the race counts when no other was logged, since retries
//!   inside the store are not; a give-up logged as its process was resumed from a pause that the
//!   window did not outlast counts as made when the pause began — the race was decided only at the
//!   resume) a majority of the 5 nodes was out of its reach: killed or hung (and for 2 s after), the proxied node while the proxy is degraded (and for 1 s
//!   after), any node during a stall the probe measured, any node that confirmed this tick for another
//!   claimant (a node confirms one claimant per tick, for ever: the nodes' AOF), any node on which a
//!   ghost confirmed this tick or a later one (from its write on, for ever: a node's claim record only
//!   grows, and it refuses every tick up to the one it holds — the AOF names the ghost's tick, not when
//!   it was written, so the timeline's record of the ghost is the evidence), and any node whose lease
//!   of this tick a dead contender held (a ghost, until its TTL; a claimant whose process was killed,
//!   paused or told to shut down after it took the lease, until the lease's expiry in the AOF). A live
//!   contender is no excuse: contenders that are alive must settle the tick between them.
//!
//! **On etcd** the same rules apply, read against what an etcd run knows instead of Redis nodes:
//! - a *majority* is 2 of the 3 members; a member counts as unusable while killed or hung (and 2 s
//!   after), and during a stall the probe measured — a linearizable read on it slower than 100 ms or
//!   refused, which is what every member shows while there is no leader (an election after the leader
//!   was killed or hung): no claim can commit then, whichever member a worker asks. No other cause
//!   makes a member unusable: a live member that answers the probe is no excuse, even if a worker's
//!   client kept asking a dead one;
//! - *granted to a claimant that died mid-claim* reads etcd's history of claim records
//!   ([`super::etcd_claims`]): a committed record is a grant; as there is no lease expiry to read, the
//!   claimant raced when its worker's clock read the tick;
//! - *held* counts a lease as held until its holder's last renewal + etcd's expiry (the TTL in whole
//!   seconds + the leader's 500 ms expiry check + the revoke's commit), not + the TTL; the nodes' own
//!   answer (`tick.lost: busy`) works as on Redis;
//! - there are no ghosts, no proxy and no stall of every node on etcd, so those rules find nothing.
//!
//! **On ZooKeeper** the etcd reading applies (a *majority* is 2 of the 3 members, a member is unusable
//! while killed or hung and 2 s after, and during a stall the probe measured: a write slower than
//! 100 ms), and one more thing makes the ensemble out of a worker's reach: a session talks to **one**
//! member at a time. While the member its session rides is killed, hung or stalled, every request of
//! that worker goes unanswered, whatever the other two do, until its client moves the session (when
//! the connection breaks, or after its connection timeout without an answer); the client logs each
//! member it establishes the session on (`succeeds to establish session to tcp://…`), and the timeline
//! names each member's port (`Happening::NodePort`). Once the client has given a member up (`enter
//! state Disconnected …`, after its connection timeout or a broken connection — or on a worker's
//! resume from a pause longer than that timeout, though its member answered), the session rides no
//! member until the client establishes it on one: it tries the members one at a time, and a try on a
//! hung member holds it for up to a connection timeout (logged at its end: `fails to establish session
//! to tcp://…`). An attempt within such an interval — riding, or trying, a member killed, hung or
//! stalled — counts as made with no majority in reach (*session's member out of reach*). A live
//! member that a worker's session did not ride or try is no excuse.
//!
//! **On a SQL server** the same rules apply with one node, the server: a *majority* is that server, so it
//! is out of reach while killed (until it is restarted and for 2 s after: the workers' pools reconnect)
//! or hung (SIGSTOP, a hang longer than `node_timeout` fails the calls, a shorter one only delays them),
//! and during a stall the probe measured — a commit of its own slower than 150 ms or unanswered.
//! *Granted to a claimant that died mid-claim* reads the server's own record of claim and lease rows
//! ([`super::sql_claims`]): a committed claim row is a grant, and its lease row's expiry less the TTL
//! is when its claimant raced, as the AOF's lease is on Redis. A claim whose commit answer was lost to a
//! kill is such a grant if it committed, and no grant (nothing in the record) if it did not. There are
//! no ghosts, no proxy and no stall of every node on SQL.
//!
//! **On a Sentinel group** the SQL reading applies: the group is one node, node 0, and a majority is
//! that node. A fault of any of its data nodes takes it out of reach from the fault until the group
//! serves again — every Sentinel names one master, which says it is one, and every data node that runs
//! streams from it (what `min_replicas_acked: all` waits for), as the harness sees it
//! ([`super::timeline::Happening::GroupServes`]) — and for 2 s after (the workers reconnect): the master
//! killed until its restart or a promotion, hung until it is continued or replaced, failed over
//! (`SENTINEL FAILOVER`) until the new master serves and the old one follows it, a replica killed or
//! hung until it follows the master again (it is waited for until the Sentinels think it down). Also out of a worker's
//! reach while its process held the new master off (`store.node_restarted` with `held_ms`: a master
//! that continues no history the process knew), and during a stall the probe measured (a write with
//! `WAIT 1` slower than 100 ms or unacknowledged: a failover's tail, a replica's resynchronisation, a
//! slow fsync). *Granted to a claimant that died mid-claim* reads the group's claim writes that a replica
//! acknowledged ([`super::claims::read_group`]), and its leases' expiries, as on Redis. There are no
//! ghosts, no proxy and no stall of every node.
//!
//! **On a Redis Cluster** the Sentinel group's reading applies to the cluster as a whole: it is node 0,
//! and a fault of any data node of any shard takes it out of reach until every shard serves again (each
//! has a master that streams to its replicas, and every live node says `cluster_state:ok`) and for 2 s
//! after. That explains a miss of a job on a shard the fault did not touch as well: the checker does
//! not narrow a fault to the jobs whose slots its shard serves, so on a cluster it is less strict about
//! misses than on a Sentinel group — and exactly as strict about everything that ran.
//!
//! The table names one cause per explained miss: the first of *won, never started*, *granted to a
//! claimant that died*, *held by a paused or crashed holder*, *held by a ghost*, *held by another run*,
//! *held by a contender of another tick*, *a dead contender of the tick*, *no quorum*
//! (planned), *no quorum* (measured stalls), *session's member out of reach*, *later tick claimed*,
//! *no live worker*, that applies.

use std::collections::BTreeSet;

use super::checker::{Input, JobSpec};
use super::claims::{worker_of, Confirms};
use super::facts::{Facts, Run, NEVER};
use super::plan::{NODES, WORKERS};
use super::report::show_time;
use super::store::StoreKind;

/// Log lines are timed when the harness reads them, a few milliseconds after they were written, and two
/// workers' lines can come out of order: a `tick.lost: later_tick_claimed` read 7 ms *before* the
/// `tick.won` of the later tick that caused it (Redis chaos run of seed 3336206994025292326, during a
/// stall of every node). The nodes' answer is the proof that the later tick was claimed first.
const LOG_ORDER_SLACK_MS: i64 = 250;
/// A claim takes at most about this long (rounds, retries): a worker paused this long after its race may
/// have been mid-claim, and an attempt's outcome is logged at most this long after it began.
const CLAIM_MS: i64 = 1_500;
/// How long after a tick's window ended a worker's last attempt may still be in flight: two rounds of a
/// claim stretched to 10× a `node_timeout` of 200 ms (the chaos config's) while the nodes answer slowly.
const IN_FLIGHT_AFTER_WINDOW_MS: i64 = 4_000;
/// A worker retries a tick it could not claim (with a backoff of up to 2 s) until the tick's window ends —
/// its misfire grace, or the job's next tick if that comes first (G4 in `docs/protocol.md`): its last
/// attempt ends at most this long before the window does.
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
    pub store: StoreKind,
    pub ttl_ms: i64,
}

/// The holds of the job's single lease key (`overlap: skip`), per the *held* rule.
pub fn holds(input: &Input<'_>, facts: &Facts, job: &JobSpec, runs: &[&Run]) -> Vec<Hold> {
    // How long a lease outlives its holder's last renewal: the TTL on Redis, etcd's expiry on etcd.
    let ttl = input.store.lease_hold_ms(input.ttl_ms);
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
            // The latest tick this worker's cluster time had reached at p.
            let offset = facts.skew_at(life.worker, p);
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
    if let Some(reason) = split_confirmations(e, tick) {
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
            "held by a contender of another tick",
            "a contender of another tick held the job's lease (overlap: skip; the nodes answered busy)",
        ),
        (
            "dead contender of the tick",
            "a dead contender's lease or claim of the tick (or a ghost's claim of a later one), and faults, left no majority until the tick's window closed",
        ),
        (
            "no quorum",
            "no quorum of Redis nodes at any attempt within the tick's window",
        ),
        (
            "nodes stalled",
            "no quorum within the tick's window: a majority of nodes stalled (measured by the probe, not planned)",
        ),
        (
            "session's member out of reach",
            "no member within the tick's window for a worker whose ZooKeeper session rode a member killed, hung or stalled (or, disconnected, was being established on one), until its client moved the session",
        ),
        (
            "later tick claimed first",
            "missed by a worker whose cluster time was ahead, which then claimed a later tick first",
        ),
    ]
    .iter()
    .find(|(kind, _)| kinds.contains(kind))
    .map_or("no live worker with a usable clock", |(_, category)| {
        category
    });
    Ok(match (e.store, category) {
        (StoreKind::Etcd, c) if c.starts_with("no quorum of Redis") => {
            "no majority of etcd members at any attempt within the tick's window (members killed or hung)"
        }
        (StoreKind::Etcd, c) if c.contains("nodes stalled") => {
            "no etcd leader within the tick's window: linearizable reads stalled on a majority of members (an election, measured by the probe)"
        }
        (StoreKind::Zookeeper, c) if c.starts_with("no quorum of Redis") => {
            "no quorum of ZooKeeper members at any attempt within the tick's window (members killed or hung)"
        }
        (StoreKind::Zookeeper, c) if c.contains("nodes stalled") => {
            "no ZooKeeper leader within the tick's window: writes stalled on a majority of members (an election, measured by the probe)"
        }
        (StoreKind::Postgres | StoreKind::Mariadb, c) if c.starts_with("no quorum of Redis") => {
            "the SQL server was down or hung at every attempt within the tick's window (killed and restarting, or SIGSTOPped)"
        }
        (StoreKind::Postgres | StoreKind::Mariadb, c) if c.contains("nodes stalled") => {
            "the SQL server's commits stalled at every attempt within the tick's window (measured by the probe, not planned)"
        }
        (StoreKind::RedisSentinel, c) if c.starts_with("no quorum of Redis") => {
            "the Sentinel group was out of reach at every attempt within the tick's window (its master killed, hung or failed over, until a new one served, or held off)"
        }
        (StoreKind::RedisSentinel, c) if c.contains("nodes stalled") => {
            "the Sentinel group's acknowledged writes stalled at every attempt within the tick's window (measured by the probe, not planned)"
        }
        (StoreKind::RedisCluster, c) if c.starts_with("no quorum of Redis") => {
            "the Redis Cluster was out of reach at every attempt within the tick's window (a shard's master killed, hung or failed over, or a replica waited for, until every shard served again, or held off)"
        }
        (StoreKind::RedisCluster, c) if c.contains("nodes stalled") => {
            "the Redis Cluster's acknowledged writes stalled at every attempt within the tick's window (measured by the probe, not planned)"
        }
        (_, c) => c,
    }
    .to_string())
}

/// The tick was confirmed on a majority for a claimant whose worker never logged `tick.won` for it, and
/// was killed or paused while racing it.
fn granted_to_the_dead(e: &Evidence<'_>, tick: i64) -> Option<String> {
    let (worker, _) = dead_grant(e, tick)?;
    Some(format!(
        "granted to a claimant of w{worker} that was killed, paused or shut down mid-claim, or that \
         gave the tick up before its late confirmations reached a majority (confirmed on a majority of \
         the nodes' AOF, no tick.won)"
    ))
}

/// The tick was confirmed for two or more claimants on different nodes (the nodes' AOF), none on a
/// majority, so that no new claimant can reach one (each node confirms one claimant per tick for good),
/// and each of them that still could — with every node left — belongs to a worker that was down, dead or
/// paused then. That takes two round 2s at once: claimants on different lease keys (workers on two
/// versions of `overlap` during a rollout) or a crash in round 2 (`docs/protocol.md`, G4).
fn split_confirmations(e: &Evidence<'_>, tick: i64) -> Option<String> {
    let claimants = e.confirms.of(&e.job.name, tick);
    let majority = e.facts.nodes / 2 + 1;
    if claimants.len() < 2 || claimants.iter().any(|(_, nodes)| nodes.len() >= majority) {
        return None;
    }
    let confirmed: usize = claimants.iter().map(|(_, nodes)| nodes.len()).sum();
    let free = e.facts.nodes.saturating_sub(confirmed);
    let could_still_win_and_ran = |(claimant, nodes): &(&str, &BTreeSet<usize>)| {
        nodes.len() + free >= majority
            && worker_of(claimant).is_none_or(|worker| excuse(e, worker, tick).is_err())
    };
    let stuck = free < majority && !claimants.iter().any(could_still_win_and_ran);
    stuck.then(|| {
        format!(
            "split confirmations: {} claimants confirmed the tick on different nodes, none on a majority, and those that could still reach one were down (two round 2s at once: a rollout's two lease keys, or a crash in round 2)",
            claimants.len()
        )
    })
}

/// A claimant that the nodes' AOF shows confirmed on a majority for `tick`, whose worker logged no
/// `tick.won` for it and was killed, paused or told to shut down (a worker that wins a tick once shutdown
/// is requested does not start it) while racing it — that is, after the claimant's first lease was written
/// (its expiry in the AOF less the TTL), within a claim's length or the grace — or gave the tick up
/// (`tick.skipped` with `no_quorum` or `contended`: its round 2 went unanswered until the window closed,
/// and its confirmations landed on stalled nodes after that): its worker, and when it died or gave up
/// (its confirms were sent by then).
fn dead_grant(e: &Evidence<'_>, tick: i64) -> Option<(usize, i64)> {
    let facts = e.facts;
    let leases = e.confirms.leases(&e.job.name, tick);
    e.confirms
        .granted(&e.job.name, tick)
        .into_iter()
        .find_map(|claimant| {
            let worker = worker_of(claimant)?;
            if e.runs.iter().any(|r| r.tick == tick && r.worker == worker) {
                return None;
            }
            // When it raced: its first lease's write (expiry less the TTL) in the AOF; etcd shows no
            // lease expiry, so there the worker's race time.
            let raced = match e.store {
                StoreKind::Redis | StoreKind::RedisSentinel | StoreKind::RedisCluster => leases
                    .iter()
                    .filter(|(c, _, _)| c == claimant)
                    .map(|(_, _, expires)| expires - e.ttl_ms)
                    .min()?,
                // ZooKeeper's lease is the session: no expiry in its log either.
                StoreKind::Etcd | StoreKind::Zookeeper => facts.race_time(worker, tick),
                // The lease row's expiry, written by the server's triggers (`super::sql_claims`).
                StoreKind::Postgres | StoreKind::Mariadb => leases
                    .iter()
                    .filter(|(c, _, _)| c == claimant)
                    .map(|(_, _, expires)| expires - e.ttl_ms)
                    .min()?,
            };
            let (from, to) = (raced - 500, raced + CLAIM_MS.max(e.job.grace_ms));
            let died = facts
                .instances_of(worker)
                .flat_map(|(_, life)| {
                    let shut_down = Some(life.end).filter(|&end| from <= end && end <= to);
                    life.disturbances_in(from, to).into_iter().chain(shut_down)
                })
                .min();
            let gave_up = facts
                .instances_of(worker)
                .flat_map(|(instance, _)| {
                    ["tick.skipped:no_quorum", "tick.skipped:contended"]
                        .into_iter()
                        .flat_map(move |label| facts.logged_at(instance, &e.job.name, tick, label))
                })
                .min();
            Some((worker, died.or(gave_up)?))
        })
}

/// When a later tick of the job was first claimed: its `tick.won` arrived, or the claimant it was granted
/// to died (see [`dead_grant`]). Claims only grow, so from then on `tick` cannot be claimed.
fn later_claim_at(e: &Evidence<'_>, tick: i64) -> Option<i64> {
    let won = e
        .runs
        .iter()
        .filter(|other| other.tick > tick)
        .map(|other| claimed_by(e, other));
    let dead = (1..=10)
        .filter_map(|k| dead_grant(e, tick + k * e.job.period_ms))
        .map(|(_, died)| died);
    won.chain(dead).min()
}

/// When `run` was claimed at the latest: when its `tick.won` arrived — or, for a line that arrived
/// as its process was resumed (the harness notes the SIGCONT a few ms late), when that pause began: a line written just before a SIGSTOP is
/// read only after the SIGCONT (PostgreSQL chaos run of seed 1796193904815138289: a `tick.won` read
/// 3.3 s after the claim that a loser's `later_tick_claimed` had already reported).
fn claimed_by(e: &Evidence<'_>, run: &Run) -> i64 {
    let paused_before = e.facts.lives.get(run.instance).and_then(|life| {
        life.stops
            .iter()
            .find(|&&(start, end)| {
                start < run.won_at && run.won_at.abs_diff(end) <= LOG_ORDER_SLACK_MS.unsigned_abs()
            })
            .map(|&(start, _)| start)
    });
    paused_before.map_or(run.won_at, |start| start.min(run.won_at))
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
    if facts.near_clock_step(worker, r) || facts.straddles_step(worker, tick) {
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
        let answered = facts.busy.get(&(instance, e.job.name.clone(), tick));
        if answered.is_some_and(|holders| {
            holders
                .iter()
                .any(|(_, held)| held.is_some_and(|t| t != tick))
        }) {
            return Ok("held by a contender of another tick");
        }
    }
    if later_claim_at(e, tick).is_some_and(|at| at <= r + 800) {
        return Ok("later tick claimed first");
    }
    if let Some(cause) = no_majority_in_window(e, instance, worker, tick, r) {
        return Ok(cause);
    }
    // A process that had just started and was still measuring its clock races nothing yet.
    if facts.starting_at(instance, worker, r) {
        return Ok("starting: its first clock measurement was under way");
    }
    // A process that started while the store was out of reach could not measure its clock, so it
    // races nothing until it can (a SQL server killed while a rollout restarts a worker).
    let ready = facts.lives[instance].ready;
    if facts.unmeasured_at(instance, worker, r)
        && facts.no_quorum_in(ready - 1_000, r, &[]).is_some()
    {
        return Ok("clock unmeasured");
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

/// The *no majority within the tick's window* rule: `Some(cause)` if it holds.
fn no_majority_in_window(
    e: &Evidence<'_>,
    instance: usize,
    worker: usize,
    tick: i64,
    r: i64,
) -> Option<&'static str> {
    let facts = e.facts;
    let job = &e.job.name;
    let logged = |event: &str| -> Vec<i64> {
        ["no_quorum", "contended"]
            .iter()
            .flat_map(|reason| facts.logged_at(instance, job, tick, &format!("{event}:{reason}")))
            .collect()
    };
    let mut attempts = logged("tick.retrying");
    let window_end = r + e.job.period_ms.min(e.job.grace_ms);
    // It gave up at the end of the window, or a later tick was claimed meanwhile (the window being over:
    // the next tick was due) — which the nodes themselves answered (`later_tick_claimed`), or which came
    // after it had tried and failed at least once (`already_claimed` from a worker of an older version).
    // A give-up that came as its process was resumed from a pause, its window having ended by then,
    // was decided at the resume; the race's last attempt was in flight (or waiting for its batch) when
    // the pause began, the last moment the process could act: it counts as ending there.
    let skipped = logged("tick.skipped")
        .into_iter()
        .min()
        .map(|at| given_up_before_pause(facts, instance, at, window_end).unwrap_or(at));
    let overtaken = facts
        .logged_at(instance, job, tick, "tick.lost:later_tick_claimed")
        .into_iter()
        .chain(
            facts
                .logged_at(instance, job, tick, "tick.lost:already_claimed")
                .into_iter()
                .filter(|_| !attempts.is_empty()),
        )
        .filter(|&lost| later_claim_at(e, tick).is_some_and(|at| at <= lost + LOG_ORDER_SLACK_MS))
        .min();
    // Or its last attempt was still in flight when the window ended, and the process was killed before
    // that attempt came back (a round stretched by slow nodes waits up to 10× `node_timeout`): the race
    // ended with the window, and a majority must have been out of reach up to its end.
    let killed_in_flight = facts.lives[instance].killed.filter(|&k| {
        !attempts.is_empty() && window_end < k && k <= window_end + IN_FLIGHT_AFTER_WINDOW_MS
    });
    let gave_up = skipped
        .into_iter()
        .chain(overtaken)
        .min()
        .or(killed_in_flight.map(|_| window_end))?;
    if gave_up < window_end - GIVE_UP_SLACK_MS {
        return None;
    }
    // The attempt that ended the race, if it is the only one (its retries inside the store are not
    // logged), or the one in flight at the window's end: a majority must have been out of reach
    // during it.
    if Some(gave_up) == skipped || attempts.is_empty() || killed_in_flight.is_some() {
        attempts.push(gave_up);
    }
    let extra = unavailable(e, worker, tick);
    let cut_off = facts.session_cut_off(instance);
    let (mut stalled, mut dead, mut quorum_lost) = (false, false, false);
    for end in attempts {
        let (a, b) = (end - CLAIM_MS, end);
        if let Some(planned) = facts.no_quorum_in(a, b, &extra) {
            quorum_lost = true;
            stalled |= !planned;
            dead |= facts.no_quorum_in(a, b, &[]) != Some(true);
        } else if !cut_off.iter().any(|&(s, t)| s <= b && a <= t) {
            return None;
        }
    }
    let cause = if dead {
        "dead contender of the tick"
    } else if stalled {
        "nodes stalled"
    } else if quorum_lost {
        "no quorum"
    } else {
        "session's member out of reach"
    };
    Some(cause)
}

/// For a give-up logged at `at`, just as `instance` was resumed from a pause (the harness notes the
/// SIGCONT a few ms late, or the line comes a few ms after it) that the window, ending at `window_end`,
/// did not outlast: when that pause began. The race loop gives a tick up only once its batch is decided,
/// and a process stopped meanwhile decides it at its resume (Redis chaos run of seed 20261291: w2, its
/// race of 21:01:00 held by a split vote's retry inside the store, was paused at 21:01:01.958 and logged
/// the three skips at its resume, 5.7 s later, with every node back). `None` if no such pause.
fn given_up_before_pause(facts: &Facts, instance: usize, at: i64, window_end: i64) -> Option<i64> {
    facts.lives[instance]
        .stops
        .iter()
        .find(|&&(start, end)| {
            start < at && window_end <= end && at.abs_diff(end) <= LOG_ORDER_SLACK_MS.unsigned_abs()
        })
        .map(|&(start, _)| start)
}

/// The nodes that `worker` could not have for `tick` besides faults, as `(node, from, to)`: those that
/// confirmed the tick for another claimant (for ever), those on which a ghost confirmed the tick or a
/// later one (from the ghost's write, for ever), those whose lease of the tick a dead contender held
/// — a ghost, or a claimant whose process was killed, paused or told to shut down after it took the
/// lease — and, on a Sentinel group, the group while `worker`'s process held its master off.
fn unavailable(e: &Evidence<'_>, worker: usize, tick: i64) -> Vec<(usize, i64, i64)> {
    let facts = e.facts;
    let mut extra: Vec<(usize, i64, i64)> = e
        .confirms
        .taken_from(&e.job.name, tick, worker)
        .into_iter()
        .map(|node| (node, i64::MIN, NEVER))
        .collect();
    for ghost in facts
        .ghosts
        .iter()
        .filter(|g| g.job == e.job.name && g.tick >= tick)
    {
        // Its claim record refuses every tick up to its own, whatever lease key a worker takes; the
        // timeline stamps the ghost once every node answered, so no earlier than its writes.
        extra.extend(ghost.confirmed.iter().map(|&node| (node, ghost.at, NEVER)));
        if ghost.tick == tick {
            let until = ghost.at + ghost.ttl_ms as i64;
            extra.extend(ghost.leased.iter().map(|&node| (node, ghost.at, until)));
        }
    }
    for (claimant, node, expires) in e.confirms.leases(&e.job.name, tick) {
        let Some(owner) = worker_of(claimant) else {
            continue;
        };
        let taken = expires - e.ttl_ms;
        for (_, life) in facts.instances_of(owner) {
            let after = |at: i64| taken - 100 <= at && at <= *expires;
            // Killed, or told to shut down (it races no more, and a lease it kept for a retry stays).
            if let Some(gone) = life.killed.or(Some(life.end)).filter(|&k| after(k)) {
                extra.push((*node, gone, *expires));
            }
            for &(stopped, resumed) in life.stops.iter().filter(|(s, _)| after(*s)) {
                extra.push((*node, stopped, resumed.min(*expires)));
            }
        }
    }
    // A Sentinel group's new master that `worker`'s process held off counted for none of its claims.
    if e.store.is_group() {
        for (instance, _) in facts.instances_of(worker) {
            let holds = facts.held_off.get(&instance).into_iter().flatten();
            extra.extend(holds.map(|&(from, until)| (0, from, until)));
        }
    }
    extra
}
