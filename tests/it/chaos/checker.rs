//! The checker: reads the ledger, the timeline of faults, the workers' JSON logs and what the lock nodes
//! wrote (their AOF, see [`super::claims`]), and decides whether the run kept redcron's promises.
//!
//! # Rules
//!
//! Times are real (see [`super::facts`]). A job's *ticks in the window* are its scheduled instants in
//! `[window.0, window.1]`: the window leaves out the first seconds (workers settle) and the last ones
//! (ticks still within someone's misfire grace when the run stopped). A tick *ran* if some worker logged
//! `run.started` for it.
//!
//! The run **fails** on any of:
//! 1. **A line that is not JSON** in any worker's stdout.
//! 2. **A duplicate**: two `tick.won` or two `run.started` for one (job, tick) across all workers, two
//!    accepted first writes (`start`) for one (job, tick) in the ledger — whatever config versions the
//!    workers ran, so also during a rollout that changes `overlap` — or one (job, tick) confirmed on a
//!    majority of the nodes for two claimants (a double grant, even if one of them never ran it).
//! 3. **A token order violation**: over all `tick.won` of a job, ordered by tick, tokens do not strictly
//!    increase (G1 grants ticks in order, G2 makes tokens grow with grants); or the ledger accepted a
//!    write that its own rule should have refused (replayed here).
//! 4. **Ledger and logs disagree**: a `run.started` without exactly one `start` write carrying its
//!    `run_id` (zero is allowed only when the run ended `lease_lost`, `timeout` or `shutdown`: the child
//!    may have been stopped before it wrote), a write whose `run_id` no `run.started` announced, or one
//!    whose job, tick, token or worker differ from its run's. (A write from a run whose worker was killed
//!    or paused between `tick.won` and `run.started` — the child was spawned, the line never written —
//!    is matched to that `tick.won` instead, and the run counts as started; so is a write from a run
//!    whose worker was killed before even `tick.won` reached its log, matched to the store's grant of
//!    the tick to that worker, confirmed on a majority of the nodes.)
//! 5. **An unexplained miss**: see [`super::misses`] for what explains a miss.
//! 6. **A stale write from a live holder**: a write the ledger rejected (a newer token had been accepted)
//!    whose run's worker process was running, neither paused nor killed, during the whole second before
//!    the write. A paused worker cannot stop its job and a killed one has left it orphaned, so their
//!    jobs' late writes are expected, and rejected by the fence; a live worker must have seen its lease
//!    lost (it cannot be taken over before the holder's deadline passes) and stopped the job.
//! 7. **A deterministic case that did not hold**: *stale write rejected* — the run whose worker was paused
//!    for longer than TTL + the job's length wrote its last write, and the ledger rejected it;
//!    *lease loss stops the job* — the run whose worker was paused past its TTL and resumed before its
//!    job's last write ended `lease_lost` and never made that write. A planned case that could not be set
//!    up (no holder found) also fails: the mechanism must be exercised every run.
//! 8. **Renewals never exercised**: no run of the long job outlived the TTL with outcome `success`.
//! 9. **A tick claimed early**: a `tick.won` that arrived when its worker's cluster time (its clock plus
//!    its measured offset to the nodes') read more than 0.1 s before the tick (away from a step of that
//!    clock, or the measurement correcting it): workers must sleep until the tick.
//! 10. **A ghost granted**: a ghost contender's claim (the harness writes it on a minority only) confirmed
//!     on a majority of the nodes.
//! 11. **A run off the schedule**: a `tick.won` for a tick that is not one of its job's scheduled instants,
//!     or of a claim that is not the schedule's (a trigger request's or a retry's: the chaos jobs have
//!     neither, so only garbage can have started it), or a ledger write for such a tick. Planted garbage
//!     must never make a job run; such a run would otherwise match its own ledger write and pass.
//! 12. **Garbage unnoticed, or valid data skipped**: a worker process that was running, unpaused, from
//!     before a garbage plant until [`GARBAGE_NOTICE_MS`] after it did not log `store.entry_skipped`
//!     naming each trigger request and member record planted (it reads both every few seconds) — unless
//!     the plan took a majority of the nodes down or hung at some instant of that window, which can keep
//!     its reads from the plant (a SQL server killed 0.3 s after a plant, slow to take connections again
//!     on a loaded machine, hid it from two workers for 12 s: Postgres seed 1795773050835739609); or a
//!     `store.entry_skipped` that names nothing planted (a junk history entry is named by no key: a history
//!     skip counts as planted garbage only when one was planted). Who read the junk history entry (each
//!     worker starting afterwards, unless the nodes holding it were down) is counted, not required.
//!
//! Every rule applies to the whole run, except misses, which are counted over the window.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::claims::{ClaimWrite, Confirms};
use super::contenders::note_contenders;
use super::facts::{Facts, InstanceLog, Run, NEVER};
use super::faults::Case;
use super::ledger::{Attempt, Phase};
use super::misses::{explain_miss, holds, Evidence};
use super::plan::VERSIONS;
use super::report::{show_time, Report, Row};
use super::store::StoreKind;
use super::timeline::{Happening, Timeline};

/// How long before a write a worker must have been running, unpaused, for a rejected write of its job
/// to be its fault (rule 6).
const LIVE_HOLDER_MS: i64 = 1_000;
/// How long after a garbage plant every running worker has read it (triggers every second, members every
/// heartbeat of 5 s, both retried after a node fault).
pub const GARBAGE_NOTICE_MS: i64 = 12_000;
/// A job as the checker needs it.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub name: String,
    /// Per config version: `overlap: skip` (one lease per job) rather than `allow`.
    pub skip: [bool; VERSIONS],
    /// The schedule fires every `period_ms`, on multiples of it.
    pub period_ms: i64,
    /// Its `misfire_grace`.
    pub grace_ms: i64,
    /// The job that outlives the TTL.
    pub long: bool,
}

/// Everything the checker reads.
pub struct Input<'a> {
    /// The store the run was on: how many nodes make a quorum, how long a lease outlives its holder.
    pub store: StoreKind,
    pub jobs: &'a [JobSpec],
    pub ttl_ms: i64,
    /// Ticks in `[window.0, window.1]` (Unix ms) are checked.
    pub window: (i64, i64),
    pub timeline: &'a Timeline,
    pub logs: &'a [InstanceLog],
    pub ledger: &'a [Attempt],
    /// Every claim the lock nodes wrote (from their AOF).
    pub claims: &'a [ClaimWrite],
    /// The deterministic cases the plan contains.
    pub planned_cases: &'a [Case],
}

/// Applies the rules of the module documentation.
pub fn check(input: &Input<'_>) -> Report {
    let mut facts = Facts::gather(input.timeline, input.logs, input.store.nodes());
    let mut report = Report::default();
    let confirms = Confirms::new(input.claims, input.store.nodes());
    adopt_unlogged_starts(input, &mut facts, &confirms, &mut report);
    for log in input.logs {
        for line in &log.bad_lines {
            report.failures.push(format!(
                "instance {} (w{}) wrote a line that is not JSON: {line:?}",
                log.instance, log.worker
            ));
        }
    }
    for text in facts.malformed.iter().chain(&facts.orphan_starts) {
        report.failures.push(format!(
            "event without its tick.won or with missing fields: {text}"
        ));
    }
    let runs_by_id: HashMap<&str, &Run> = facts
        .runs
        .iter()
        .filter_map(|run| Some((run.run_id.as_deref()?, run)))
        .collect();
    check_ledger_against_logs(input, &facts, &runs_by_id, &mut report);
    for job in input.jobs {
        let row = check_job(input, &facts, &confirms, job, &runs_by_id, &mut report);
        report.rows.push(row);
    }
    note_contenders(input, &facts, &confirms, &mut report);
    check_cases(input, &facts, &runs_by_id, &mut report);
    check_garbage(&facts, &mut report);
    let renewed = facts.runs.iter().filter(|run| {
        input.jobs.iter().any(|job| job.long && job.name == run.job)
            && run.outcome.as_deref() == Some("success")
            && run.duration_ms.is_some_and(|ms| ms as i64 > input.ttl_ms)
    });
    let renewed = renewed.count();
    report.notes.push(format!(
        "long runs that outlived the {} ms TTL by renewing: {renewed}",
        input.ttl_ms
    ));
    if renewed == 0 && input.jobs.iter().any(|job| job.long) {
        report
            .failures
            .push("no run of the long job outlived the TTL: renewals were not exercised".into());
    }
    if input.store == StoreKind::Zookeeper {
        let moves: usize = facts
            .sessions
            .values()
            .map(|s| s.len().saturating_sub(1))
            .sum();
        let cut_off: i64 = (0..facts.lives.len())
            .flat_map(|instance| facts.session_cut_off(instance))
            .map(|(from, to)| to.min(input.window.1) - from)
            .filter(|ms| *ms > 0)
            .sum();
        report.notes.push(format!(
            "ZooKeeper sessions: {} established by {} processes, moved {moves} times; {cut_off} ms in all with a session's member out of reach",
            facts.sessions.values().map(Vec::len).sum::<usize>(),
            facts.sessions.len()
        ));
    }
    let winners: BTreeSet<usize> = facts.runs.iter().map(|run| run.worker).collect();
    report.notes.push(format!(
        "workers that won ticks: {}",
        winners
            .iter()
            .map(|w| format!("w{w}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    report
}

/// A worker killed (or paused) between spawning a job and logging `run.started` leaves a run that only
/// the ledger shows: a first write whose run id no `run.started` names, but whose job, tick, token and
/// worker match a `tick.won` without a run. Such a run counts as started (rule 4's exception). A worker
/// killed so soon after its win that not even `tick.won` reached its log (its last lines die with it,
/// while the job it spawned goes on) leaves only the store's grant: a first write whose tick the nodes
/// confirmed on a majority for a claimant of that worker, killed within [`UNLOGGED_WIN_MS`] of the
/// write, counts as that grant's run.
fn adopt_unlogged_starts(
    input: &Input<'_>,
    facts: &mut Facts,
    confirms: &Confirms,
    report: &mut Report,
) {
    let logged: BTreeSet<&str> = facts
        .runs
        .iter()
        .filter_map(|r| r.run_id.as_deref())
        .collect();
    let (mut adopted, mut granted_runs) = (Vec::new(), Vec::new());
    for attempt in input.ledger.iter().filter(|a| a.phase == Phase::Start) {
        if logged.contains(attempt.run_id.as_str()) {
            continue;
        }
        let tick = super::facts::parse_instant(&attempt.tick);
        let found = facts.runs.iter().position(|run| {
            run.run_id.is_none()
                && run.job == attempt.job
                && Some(run.tick) == tick
                && run.token == attempt.token
                && attempt.worker == format!("w{}", run.worker)
                && facts.lives[run.instance].disturbed_in(run.won_at - 100, run.won_at + 1_500)
        });
        if let Some(index) = found {
            adopted.push((index, attempt.run_id.clone(), attempt.at_ms));
            continue;
        }
        let Some(tick) = tick else { continue };
        let worker = attempt
            .worker
            .strip_prefix('w')
            .and_then(|w| w.parse().ok());
        let granted = confirms
            .granted(&attempt.job, tick)
            .into_iter()
            .any(|claimant| super::claims::worker_of(claimant) == worker);
        let killed = worker.and_then(|worker| {
            facts.instances_of(worker).find(|(_, life)| {
                life.ready <= attempt.at_ms
                    && life.killed.is_some_and(|k| {
                        attempt.at_ms - UNLOGGED_WIN_MS <= k && k <= attempt.at_ms + UNLOGGED_WIN_MS
                    })
            })
        });
        if let (true, Some((instance, life))) = (granted, killed) {
            let run = Run {
                instance,
                worker: life.worker,
                job: attempt.job.clone(),
                tick,
                token: attempt.token,
                won_at: attempt.at_ms,
                run_id: None,
                started_at: None,
                finished_at: None,
                outcome: None,
                duration_ms: None,
                series: None,
            };
            granted_runs.push((run, attempt.run_id.clone(), attempt.at_ms));
        }
    }
    for (run, run_id, at) in granted_runs {
        facts.runs.push(run);
        adopted.push((facts.runs.len() - 1, run_id, at));
    }
    for (index, run_id, at) in adopted {
        let run = &mut facts.runs[index];
        report.notes.push(format!(
            "run {run_id} ({} at {}, w{}) started but its worker was killed or paused before logging \
             run.started; the ledger shows it",
            run.job,
            show_time(run.tick),
            run.worker
        ));
        run.run_id = Some(run_id);
        run.started_at = Some(at);
    }
}

/// How far from a ledger write the kill of the worker whose grant it is may be, for a run no log line
/// names (see [`adopt_unlogged_starts`]): the job starts within milliseconds of the grant, and a killed
/// worker's child writes on after it.
const UNLOGGED_WIN_MS: i64 = 2_000;

/// Rule 4, and the ledger replay of rule 3.
fn check_ledger_against_logs(
    input: &Input<'_>,
    facts: &Facts,
    runs_by_id: &HashMap<&str, &Run>,
    report: &mut Report,
) {
    let mut starts: HashMap<&str, usize> = HashMap::new();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for attempt in input.ledger {
        let should = match (last.get(attempt.resource.as_str()), attempt.phase) {
            (None, _) => true,
            (Some(&last), Phase::Start) => attempt.token > last,
            (Some(&last), Phase::End) => attempt.token >= last,
        };
        if should != attempt.accepted {
            report.failures.push(format!(
                "the ledger's verdict contradicts its rule: {attempt:?}"
            ));
        }
        if attempt.accepted {
            last.insert(&attempt.resource, attempt.token);
        }
        if attempt.phase == Phase::Start {
            *starts.entry(&attempt.run_id).or_default() += 1;
        }
        match runs_by_id.get(attempt.run_id.as_str()) {
            None => report.failures.push(format!(
                "a ledger write from a run no worker logged: {attempt:?}"
            )),
            Some(run) => {
                let worker_id = format!("w{}", run.worker);
                let tick = super::facts::parse_instant(&attempt.tick);
                if run.job != attempt.job
                    || tick != Some(run.tick)
                    || run.token != attempt.token
                    || attempt.worker != worker_id
                {
                    report.failures.push(format!(
                        "a ledger write does not match its run.started ({run:?}): {attempt:?}"
                    ));
                }
            }
        }
    }
    for run in &facts.runs {
        let Some(run_id) = run.run_id.as_deref() else {
            continue;
        };
        match starts.get(run_id).copied().unwrap_or(0) {
            1 => {}
            0 if matches!(run.outcome.as_deref(), Some("lease_lost" | "timeout" | "shutdown")) => {
                report.notes.push(format!(
                    "run {run_id} ({} at {}) was stopped ({}) before its first write",
                    run.job,
                    show_time(run.tick),
                    run.outcome.as_deref().unwrap_or_default()
                ));
            }
            n => report.failures.push(format!(
                "run.started of {} at {} (run {run_id}, w{}) has {n} start writes in the ledger, outcome {:?}",
                run.job,
                show_time(run.tick),
                run.worker,
                run.outcome
            )),
        }
    }
}

/// Rules 2, 3, 5 and 6 for one job.
fn check_job(
    input: &Input<'_>,
    facts: &Facts,
    confirms: &Confirms,
    job: &JobSpec,
    runs_by_id: &HashMap<&str, &Run>,
    report: &mut Report,
) -> Row {
    let mut row = Row {
        job: job.name.clone(),
        overlap: match (job.skip.iter().all(|&s| s), job.skip.iter().any(|&s| s)) {
            (true, _) => "skip",
            (false, true) => "rolled",
            (false, false) => "allow",
        },
        ..Row::default()
    };
    let runs: Vec<&Run> = facts
        .runs
        .iter()
        .filter(|run| run.job == job.name)
        .collect();

    // Rule 2: duplicates, over the whole run (not only the window).
    let mut wins: BTreeMap<i64, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        wins.entry(run.tick).or_default().push(run);
    }
    let mut accepted_starts: BTreeMap<i64, Vec<&Attempt>> = BTreeMap::new();
    for attempt in input
        .ledger
        .iter()
        .filter(|a| a.job == job.name && a.phase == Phase::Start && a.accepted)
    {
        if let Some(tick) = super::facts::parse_instant(&attempt.tick) {
            accepted_starts.entry(tick).or_default().push(attempt);
        }
    }
    let mut duplicated: BTreeSet<i64> = BTreeSet::new();
    for (tick, won) in &wins {
        if won.len() > 1 {
            duplicated.insert(*tick);
            let who: Vec<String> = won
                .iter()
                .map(|r| format!("w{} token {} run {:?}", r.worker, r.token, r.run_id))
                .collect();
            report.failures.push(format!(
                "DUPLICATE: {} at {} was granted {} times: {}",
                job.name,
                show_time(*tick),
                won.len(),
                who.join("; ")
            ));
        }
    }
    for (tick, accepted) in &accepted_starts {
        if accepted.len() > 1 && duplicated.insert(*tick) {
            report.failures.push(format!(
                "DUPLICATE: {} at {} has {} accepted first writes: {accepted:?}",
                job.name,
                show_time(*tick),
                accepted.len()
            ));
        }
    }
    for (tick, claimants) in confirms
        .double_grants()
        .into_iter()
        .filter_map(|(name, tick, claimants)| (name == job.name).then_some((tick, claimants)))
    {
        if duplicated.insert(tick) {
            report.failures.push(format!(
                "DUPLICATE GRANT ON THE NODES: {} at {} was confirmed on a majority for {}",
                job.name,
                show_time(tick),
                claimants.join(" and ")
            ));
        }
    }
    row.duplicates = duplicated.len();

    // Rule 11: every run is a scheduled tick's.
    for run in &runs {
        if run.tick.rem_euclid(job.period_ms) != 0 || run.series.is_some() {
            report.failures.push(format!(
                "RUN OFF THE SCHEDULE: {} at {} won by w{} (token {}, {}): no scheduled tick of the job",
                job.name,
                show_time(run.tick),
                run.worker,
                run.token,
                run.series.as_deref().unwrap_or("off the schedule's instants")
            ));
        }
    }
    for attempt in input.ledger.iter().filter(|a| a.job == job.name) {
        let tick = super::facts::parse_instant(&attempt.tick);
        if tick.is_none_or(|tick| tick.rem_euclid(job.period_ms) != 0) {
            report.failures.push(format!(
                "RUN OFF THE SCHEDULE: a ledger write for no scheduled tick of {}: {attempt:?}",
                job.name
            ));
        }
    }

    // Rule 9: no claim before the tick is due on the claimant's cluster time.
    for run in &runs {
        let clock = run.won_at + facts.skew_at(run.worker, run.won_at);
        if clock < run.tick - 100 && !facts.near_clock_step(run.worker, run.won_at) {
            report.failures.push(format!(
                "EARLY CLAIM: {} at {} was won by w{} at {}, when its cluster time read {}",
                job.name,
                show_time(run.tick),
                run.worker,
                show_time(run.won_at),
                show_time(clock)
            ));
        }
    }

    // Rule 3: tokens strictly increase with the tick.
    let mut previous: Option<&Run> = None;
    for run in wins.values().flatten() {
        if let Some(before) = previous {
            if run.token <= before.token && run.tick != before.tick {
                row.token_violations += 1;
                report.failures.push(format!(
                    "TOKEN ORDER: {} at {} got token {} (w{}) after {} got {} (w{})",
                    job.name,
                    show_time(run.tick),
                    run.token,
                    run.worker,
                    show_time(before.tick),
                    before.token,
                    before.worker
                ));
            }
        }
        previous = Some(run);
    }

    // Rule 5: misses.
    let holds = holds(input, facts, job, &runs);
    let evidence = Evidence {
        facts,
        job,
        runs: &runs,
        holds: &holds,
        confirms,
        store: input.store,
        ttl_ms: input.ttl_ms,
    };
    let started: BTreeSet<i64> = runs
        .iter()
        .filter(|r| r.run_id.is_some())
        .map(|r| r.tick)
        .collect();
    let first = (input.window.0 + job.period_ms - 1).div_euclid(job.period_ms) * job.period_ms;
    for tick in (first..=input.window.1).step_by(job.period_ms as usize) {
        row.ticks += 1;
        if started.contains(&tick) {
            row.run += 1;
            continue;
        }
        match explain_miss(&evidence, tick) {
            Ok(reason) => {
                row.explained += 1;
                *report
                    .reasons
                    .entry(format!("{}: {reason}", job.name))
                    .or_default() += 1;
            }
            Err(diagnosis) => {
                row.unexplained += 1;
                report.failures.push(format!(
                    "UNEXPLAINED MISS: {} at {}: {diagnosis}",
                    job.name,
                    show_time(tick)
                ));
            }
        }
    }

    // Rule 6: stale writes.
    for attempt in input
        .ledger
        .iter()
        .filter(|a| a.job == job.name && !a.accepted)
    {
        row.stale_rejected += 1;
        let Some(run) = runs_by_id.get(attempt.run_id.as_str()) else {
            continue;
        };
        let life = &facts.lives[run.instance];
        let taken_over = input.ledger.iter().find(|a| {
            a.resource == attempt.resource
                && a.accepted
                && a.token > attempt.token
                && a.at_ms <= attempt.at_ms
        });
        let late_by = taken_over.map_or(0, |a| attempt.at_ms - a.at_ms);
        if life.disturbed_in(attempt.at_ms - LIVE_HOLDER_MS, attempt.at_ms) {
            let how = if life.killed.is_some_and(|k| k <= attempt.at_ms) {
                "crashed holder's orphaned job"
            } else {
                "paused holder's job"
            };
            report.notes.push(format!(
                "stale {:?} write rejected: {} at {} (w{}, token {}), {how}, {late_by} ms after a newer token was accepted",
                attempt.phase,
                job.name,
                attempt.tick,
                run.worker,
                attempt.token
            ));
        } else {
            row.stale_unexplained += 1;
            report.failures.push(format!(
                "STALE WRITE FROM A LIVE HOLDER: {} at {} (w{} instance {}, token {}, {:?}) came {late_by} ms after a newer \
                 token was accepted, while its worker had been running unpaused for over {LIVE_HOLDER_MS} ms: the \
                 worker did not stop a job whose lease it had lost",
                job.name, attempt.tick, run.worker, run.instance, attempt.token, attempt.phase
            ));
        }
    }
    row
}

/// Rule 7.
fn check_cases(
    input: &Input<'_>,
    facts: &Facts,
    runs_by_id: &HashMap<&str, &Run>,
    report: &mut Report,
) {
    let mut seen: Vec<Case> = Vec::new();
    for (at, happening) in &input.timeline.entries {
        let Happening::CaseBegan {
            case,
            instance,
            run_id,
        } = happening
        else {
            continue;
        };
        seen.push(*case);
        let Some(run) = runs_by_id.get(run_id.as_str()) else {
            report
                .failures
                .push(format!("CASE {case}: run {run_id} is not in the logs"));
            continue;
        };
        let ends: Vec<&Attempt> = input
            .ledger
            .iter()
            .filter(|a| &a.run_id == run_id && a.phase == Phase::End)
            .collect();
        let life = &facts.lives[*instance];
        let resumed = life
            .stops
            .iter()
            .find(|&&(s, _)| s >= *at - 100)
            .map_or(NEVER, |&(_, e)| e);
        let head = format!(
            "CASE {case}: w{} paused at {} until {} while running {} at {} (token {})",
            run.worker,
            show_time(*at),
            show_time(resumed),
            run.job,
            show_time(run.tick),
            run.token
        );
        match case {
            Case::StaleWriteRejected => match ends.as_slice() {
                [end] if !end.accepted => {
                    let newer = input
                        .ledger
                        .iter()
                        .find(|a| a.resource == end.resource && a.accepted && a.token > end.token);
                    report.notes.push(format!(
                        "{head}: its job's late write came while the worker was paused and was rejected (last accepted token {}, first written by {})",
                        end.previous.unwrap_or_default(),
                        newer.map_or("?".to_string(), |a| format!("{} for {}", a.worker, a.tick))
                    ));
                }
                _ => report.failures.push(format!(
                    "{head}: expected exactly one late write, rejected; found {ends:?}"
                )),
            },
            Case::LeaseLossStopsJob => {
                if run.outcome.as_deref() == Some("lease_lost") && ends.is_empty() {
                    report.notes.push(format!("{head}: once resumed, the worker saw the lease lost and stopped the job before its last write"));
                } else {
                    report.failures.push(format!("{head}: expected outcome lease_lost and no last write; outcome {:?}, last writes {ends:?}", run.outcome));
                }
            }
        }
    }
    for case in input.planned_cases {
        if !seen.contains(case) {
            report.failures.push(format!(
                "CASE {case}: planned but never set up (see the timeline's skipped faults)"
            ));
        }
    }
}

/// Whether a `store.entry_skipped` is about a history entry: `history entry skipped` on Redis and etcd,
/// `history entry of tick "<tick>" … skipped` on a SQL server (whose rows are named by their tick),
/// `history entry "<tick>-<id>" skipped` on ZooKeeper (its node's name, the id escaped).
/// The id an entry skipped names: what follows `triggers/` or `members/` up to the closing quote.
fn stored_key(error: &str) -> Option<&str> {
    let start = ["triggers/", "members/"]
        .iter()
        .find_map(|kind| error.find(kind).map(|at| at + kind.len()))?;
    let rest = &error[start..];
    let key = &rest[..rest.find(['"', ' ', ':']).unwrap_or(rest.len())];
    (!key.is_empty()).then_some(key)
}

fn names_junk_history(error: &str) -> bool {
    error.contains("history entry skipped")
        || error.contains("history entry of tick") && error.contains("skipped")
        || error.starts_with("zookeeper: history entry \"") && error.contains("skipped")
}

/// Rule 12, and the count of skipped entries.
fn check_garbage(facts: &Facts, report: &mut Report) {
    let (mut expected, mut outages) = (0, 0);
    for plant in &facts.garbage {
        let window = (plant.at, plant.at + GARBAGE_NOTICE_MS);
        // Planned faults only: a stall the probe measured is too short to hide a plant for the window.
        if facts.no_quorum_in(window.0, window.1, &[]) == Some(true) {
            outages += 1;
            continue;
        }
        for (instance, life) in facts.lives.iter().enumerate() {
            if life.ready > plant.at || !life.running_throughout(window.0, window.1) {
                continue;
            }
            expected += 1;
            let skipped = facts.entries_skipped.get(&instance);
            let named =
                |key: &str| skipped.is_some_and(|all| all.iter().any(|(_, e)| e.contains(key)));
            let unnoticed: Vec<&str> = plant
                .keys
                .iter()
                .map(String::as_str)
                .filter(|k| !named(k))
                .collect();
            if !unnoticed.is_empty() {
                report.failures.push(format!(
                    "GARBAGE UNNOTICED: w{} (process #{instance}) ran for {GARBAGE_NOTICE_MS} ms after garbage plant #{} at {} \
                     and logged no store.entry_skipped for {unnoticed:?}",
                    life.worker,
                    plant.tag,
                    show_time(plant.at)
                ));
            }
        }
    }
    let planted = |error: &str| {
        facts.garbage.iter().any(|plant| {
            plant.keys.iter().any(|key| error.contains(key.as_str()))
                || plant.history.is_some() && names_junk_history(error)
                || stored_key(error).is_some_and(|key| plant.failed.iter().any(|f| f.contains(key)))
        })
    };
    let (mut events, mut history, mut processes) = (0, 0, 0);
    let mut instances: Vec<&usize> = facts.entries_skipped.keys().collect();
    instances.sort();
    for instance in instances {
        let skipped = &facts.entries_skipped[instance];
        processes += 1;
        events += skipped.len();
        history += usize::from(skipped.iter().any(|(_, e)| names_junk_history(e)));
        for (at, error) in skipped {
            if !planted(error) {
                report.failures.push(format!(
                    "ENTRY SKIPPED THAT NOBODY PLANTED: process #{instance} at {}: {error}",
                    show_time(*at)
                ));
            }
        }
    }
    if !facts.garbage.is_empty() {
        let keys: usize = facts.garbage.iter().map(|p| p.keys.len()).sum();
        report.notes.push(format!(
            "garbage: {} plants ({keys} requests and members, {} junk history entries; on nodes {}); \
             store.entry_skipped: {events} events from {processes} processes ({history} of them read a junk history \
             entry); {expected} checks of a running process against a plant; {outages} plants not checked (the plan \
             took a majority of the nodes out within {GARBAGE_NOTICE_MS} ms of them)",
            facts.garbage.len(),
            facts.garbage.iter().filter(|p| p.history.is_some()).count(),
            facts
                .garbage
                .iter()
                .map(|p| format!("#{} {:?}", p.tag, p.nodes))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}
