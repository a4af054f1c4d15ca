//! The agenda: which ticks of which jobs are due, and which of them a worker races.
//!
//! Pure logic on a given `now` (no clock, no I/O), so the rules — the first tick after a start, what a late
//! worker races, superseded and misfired ticks — are unit-tested with fixed times.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::Utc;
use tracing::warn;

use crate::config::JobConfig;
use crate::lock::Overlap;
use crate::logging::events;
use crate::schedule::Tick;

/// The most passed-over ticks of one job that one call reports (the newest); a worker paused for an hour
/// with an every-second job does not report 3,600 ticks one by one.
const PASSED_PER_JOB: usize = 100;

/// Why a due tick is not raced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Passed {
    /// Older than the job's misfire grace.
    Misfire,
    /// Within the grace, but a later tick of the same `overlap: skip` job is due too: only that one is raced.
    Superseded,
}

impl Passed {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Passed::Misfire => "misfire",
            Passed::Superseded => "superseded",
        }
    }
}

/// What [`Agenda::take_due`] found due.
#[derive(Debug, Default)]
pub(super) struct Due {
    /// The ticks to race: (job index, tick).
    pub(super) race: Vec<(usize, Tick)>,
    /// The ticks passed over, newest [`PASSED_PER_JOB`] per job: (job index, tick, why).
    pub(super) passed: Vec<(usize, Tick, Passed)>,
}

/// The next tick of every job, ordered by time.
pub(super) struct Agenda {
    /// Shared with the worker's context and the claims of each tick (a reload swaps in new ones).
    jobs: Vec<Arc<JobConfig>>,
    /// tick → indexes of the jobs due then.
    due: BTreeMap<Tick, Vec<usize>>,
}

impl Agenda {
    /// Each job's first tick: the latest one within its misfire grace (a worker that comes up late still
    /// races for it; the claim stops it if someone ran it), or else the next one.
    ///
    /// Every store keeps its claims across restarts (the Redis nodes, the embedded store's file), so a
    /// restarted worker that races a tick another process already ran finds it claimed.
    pub(super) fn new(jobs: Vec<Arc<JobConfig>>, now: chrono::DateTime<Utc>) -> Agenda {
        let mut agenda = Agenda {
            jobs,
            due: BTreeMap::new(),
        };
        let now_tick = Tick(now.timestamp_millis());
        for (index, job) in agenda.jobs.iter().enumerate() {
            let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or_default();
            let mut first = job
                .schedule
                .next_after(now - grace - chrono::Duration::milliseconds(1));
            // Of several ticks within the grace, only the latest is raced with `overlap: skip` (the job
            // runs once at a time anyway); with `overlap: allow` every one is (see `take_due`).
            while let Some(tick) = first.filter(|_| job.overlap == Overlap::Skip) {
                match job.schedule.next_after(tick.to_utc()) {
                    Some(next) if next <= now_tick => first = Some(next),
                    _ => break,
                }
            }
            if let Some(tick) = first {
                agenda.due.entry(tick).or_default().push(index);
            }
        }
        agenda
    }

    /// The agenda of `jobs` after a reload of the config: a job whose definition is unchanged keeps the
    /// tick it waits for; a new or changed job starts from its next tick after `now`; a removed job is no
    /// longer raced.
    pub(super) fn reload(self, jobs: Vec<Arc<JobConfig>>, now: chrono::DateTime<Utc>) -> Agenda {
        let mut waiting: HashMap<(String, String), Tick> = HashMap::new();
        for (tick, indexes) in &self.due {
            for index in indexes {
                let job = &self.jobs[*index];
                waiting.insert((job.name.clone(), job.fingerprint()), *tick);
            }
        }
        let mut agenda = Agenda {
            jobs,
            due: BTreeMap::new(),
        };
        for (index, job) in agenda.jobs.iter().enumerate() {
            let kept = waiting.get(&(job.name.clone(), job.fingerprint())).copied();
            if let Some(tick) = kept.or_else(|| job.schedule.next_after(now)) {
                agenda.due.entry(tick).or_default().push(index);
            }
        }
        agenda
    }

    /// The agenda of the same jobs, each from its next tick after `now`: for a clock that was not cluster
    /// time until now.
    pub(super) fn restart(self, now: chrono::DateTime<Utc>) -> Agenda {
        Agenda::new(self.jobs, now)
    }

    /// The job at `index` (as [`Agenda::take_due`] names them).
    pub(super) fn job(&self, index: usize) -> &Arc<JobConfig> {
        &self.jobs[index]
    }

    /// The jobs' first ticks that are earlier than `now`, oldest first: at start, those within their
    /// misfire grace, which a worker that starts late still races.
    pub(super) fn before(&self, now: chrono::DateTime<Utc>) -> Vec<(&JobConfig, Tick)> {
        let now = Tick(now.timestamp_millis());
        self.due
            .range(..now)
            .flat_map(|(tick, indexes)| indexes.iter().map(|index| (&*self.jobs[*index], *tick)))
            .collect()
    }

    pub(super) fn next_tick(&self) -> Option<Tick> {
        self.due.keys().next().copied()
    }

    /// Removes and returns the ticks due at `now`, and schedules each job's next tick.
    ///
    /// When a job has several ticks due (the worker was paused, or started late), those past the misfire
    /// grace are logged as skipped; of the others, a job with `overlap: allow` races every one, and a job
    /// with `overlap: skip` only the latest — as cron does after a missed run — logging the older ones as
    /// superseded.
    pub(super) fn take_due(&mut self, now: chrono::DateTime<Utc>) -> Due {
        let now_tick = Tick(now.timestamp_millis());
        let mut taken = Due::default();
        while let Some(entry) = self.due.first_entry() {
            if *entry.key() > now_tick {
                break;
            }
            let (tick, indexes) = entry.remove_entry();
            for index in indexes {
                let job = &self.jobs[index];
                let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or_default();
                let mut due = vec![tick];
                let mut next = job.schedule.next_after(tick.to_utc());
                while let Some(candidate) = next.filter(|t| *t <= now_tick) {
                    due.push(candidate);
                    next = job.schedule.next_after(candidate.to_utc());
                }
                // Ticks past the grace are never raced; of the rest, `overlap: allow` races every one (each is
                // a run of its own: superseding a tick still inside its grace would lose it for good if no
                // other worker raced it), `overlap: skip` only the latest, as cron does after a missed run.
                let (stale, fresh): (Vec<Tick>, Vec<Tick>) =
                    due.into_iter().partition(|t| now - t.to_utc() > grace);
                let mut passed: Vec<(Tick, Passed)> =
                    stale.iter().map(|t| (*t, Passed::Misfire)).collect();
                match (job.overlap, fresh.split_last()) {
                    (_, None) => {}
                    (Overlap::Allow, Some(_)) => {
                        taken.race.extend(fresh.iter().map(|t| (index, *t)))
                    }
                    (Overlap::Skip, Some((latest, older))) => {
                        passed.extend(older.iter().map(|t| (*t, Passed::Superseded)));
                        taken.race.push((index, *latest));
                    }
                }
                let latest = fresh.last().copied();
                let skip = passed.len().saturating_sub(PASSED_PER_JOB);
                log_passed(job, &passed, skip, latest, now);
                taken.passed.extend(
                    passed
                        .into_iter()
                        .skip(skip)
                        .map(|(tick, why)| (index, tick, why)),
                );
                if let Some(next) = next {
                    self.due.entry(next).or_default().push(index);
                }
            }
        }
        taken
    }
}

/// Logs every passed-over tick of `job` with its reason, one event each (a tick passed over without a
/// word is the failure operators fear most), except the `skip` oldest, which one event sums up (a worker
/// paused for an hour does not log 3,600 lines per job).
fn log_passed(
    job: &JobConfig,
    passed: &[(Tick, Passed)],
    skip: usize,
    latest: Option<Tick>,
    now: chrono::DateTime<Utc>,
) {
    let name = &job.name;
    for why in [Passed::Misfire, Passed::Superseded] {
        let older: Vec<Tick> = (passed[..skip].iter())
            .filter(|(_, w)| *w == why)
            .map(|(tick, _)| *tick)
            .collect();
        if let (Some(first), Some(last)) = (older.first(), older.last()) {
            warn!(event = events::tick::SKIPPED, job = %name, tick = %first, reason = why.as_str(),
                  count = older.len() as u64, through = %last,
                  "Skipped this many ticks, the oldest passed over at once (the newest are logged one by one)");
        }
    }
    for (tick, why) in &passed[skip..] {
        let late_ms = (now - tick.to_utc()).num_milliseconds();
        match why {
            Passed::Misfire => {
                warn!(event = events::tick::SKIPPED, job = %name, tick = %tick, reason = "misfire", count = 1u64, late_ms,
                      "Skipped: the tick is older than the job's misfire grace")
            }
            Passed::Superseded => {
                warn!(event = events::tick::SKIPPED, job = %name, tick = %tick, reason = "superseded", count = 1u64,
                      latest = %latest.map_or(String::new(), |t| t.to_string()), late_ms,
                      "Skipped: the worker came late to this tick and a later one is due too; racing only the latest (overlap: skip)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use chrono::{DateTime, TimeZone, Utc};

    use super::*;
    use crate::config::Command;
    use crate::schedule::Schedule;

    fn job(name: &str, overlap: Overlap, grace_secs: u64) -> Arc<JobConfig> {
        Arc::new(JobConfig {
            name: name.to_string(),
            schedule: Schedule::parse("* * * * * *", chrono_tz::UTC).expect("valid"),
            command: Command::Argv(vec!["true".to_string()]),
            command_as_written: None,
            env: BTreeMap::new(),
            inherit_env: crate::config::InheritEnv::All,
            workdir: None,
            timeout: None,
            stop_grace: Duration::from_secs(1),
            overlap,
            misfire_grace: Duration::from_secs(grace_secs),
            jitter: Duration::ZERO,
            alerts: Default::default(),
            retry: Default::default(),
            enabled: true,
            output_tail: 0,
        })
    }

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0)
            .single()
            .expect("valid")
    }

    fn tick(secs: i64) -> Tick {
        Tick(at(secs).timestamp_millis())
    }

    /// A worker that wakes 3 s late races every tick still inside the grace of an `overlap: allow` job, in
    /// order — a tick in its grace is never superseded, or it could be lost for good — and only the latest
    /// of an `overlap: skip` job.
    #[test]
    fn a_late_worker_races_every_tick_in_the_grace_of_an_allow_job() {
        let jobs = [
            job("allow", Overlap::Allow, 10),
            job("skip", Overlap::Skip, 10),
        ];
        let start = at(0) + chrono::Duration::milliseconds(500);
        let mut agenda = Agenda::new(jobs.to_vec(), start);
        // At start: the ticks within the grace (see `the_first_ticks_after_a_start`); then tick 1 is next.
        agenda.take_due(start);
        assert_eq!(agenda.next_tick(), Some(tick(1)));
        let taken = agenda
            .take_due(at(3) + chrono::Duration::milliseconds(100))
            .race;
        assert_eq!(
            taken,
            vec![(0, tick(1)), (0, tick(2)), (0, tick(3)), (1, tick(3))]
        );
        assert_eq!(agenda.next_tick(), Some(tick(4)));
    }

    /// Ticks past the grace are never raced, whatever the overlap rule.
    #[test]
    fn ticks_past_the_grace_are_not_raced() {
        let jobs = [job("allow", Overlap::Allow, 2)];
        let mut agenda = Agenda::new(jobs.to_vec(), at(0) + chrono::Duration::milliseconds(500));
        let taken = agenda
            .take_due(at(5) + chrono::Duration::milliseconds(100))
            .race;
        assert_eq!(taken, vec![(0, tick(4)), (0, tick(5))]);
    }

    /// At start, a worker races the ticks within the grace (every one with `allow`, the latest with
    /// `skip`): every store remembers claims across restarts, so a tick another process ran is found
    /// claimed.
    #[test]
    fn the_first_ticks_after_a_start() {
        let jobs = [
            job("allow", Overlap::Allow, 2),
            job("skip", Overlap::Skip, 2),
        ];
        let mut agenda = Agenda::new(jobs.to_vec(), at(10) + chrono::Duration::milliseconds(500));
        let taken = agenda
            .take_due(at(10) + chrono::Duration::milliseconds(500))
            .race;
        assert_eq!(taken, vec![(0, tick(9)), (0, tick(10)), (1, tick(10))]);
        assert_eq!(agenda.next_tick(), Some(tick(11)));
    }

    /// A reload keeps an unchanged job's pending tick (a worker that is late for it still races it),
    /// starts a new or changed job at its next tick after the reload, and drops a removed job.
    #[test]
    fn a_reload_keeps_unchanged_jobs_ticks_and_starts_new_ones_at_their_next() {
        let jobs = vec![
            job("kept", Overlap::Skip, 10),
            job("changed", Overlap::Skip, 10),
            job("gone", Overlap::Skip, 10),
        ];
        let agenda = Agenda::new(jobs, at(0) + chrono::Duration::milliseconds(500));
        assert_eq!(agenda.next_tick(), Some(tick(0)));
        let reloaded = vec![
            job("kept", Overlap::Skip, 10),
            job("changed", Overlap::Allow, 10),
            job("new", Overlap::Skip, 10),
        ];
        // The reload comes 2.5 s later: `kept` still waits for tick 0, the others start at tick 3.
        let mut agenda = agenda.reload(reloaded, at(2) + chrono::Duration::milliseconds(500));
        let due = agenda.take_due(at(3));
        let named = |i: usize| agenda.job(i).name.clone();
        let raced: Vec<(String, Tick)> = due.race.iter().map(|(i, t)| (named(*i), *t)).collect();
        let kept = "kept".to_string();
        let (changed, new) = ("changed".to_string(), "new".to_string());
        assert_eq!(
            raced,
            vec![(kept.clone(), tick(3)), (changed, tick(3)), (new, tick(3))]
        );
        // Only `kept` had ticks 0 to 2 pending: superseded by tick 3, not lost without a trace.
        let passed: Vec<(String, Tick)> =
            due.passed.iter().map(|(i, t, _)| (named(*i), *t)).collect();
        let pending = [tick(0), tick(1), tick(2)].map(|t| (kept.clone(), t));
        assert_eq!(passed, pending.to_vec());
    }
}
