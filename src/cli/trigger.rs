//! `redcron trigger JOB [--wait] [--timeout DURATION]`: one extra run of a job now, through the lock.
//!
//! "Now" is cluster time, as the workers keep it ([`crate::clock::cluster`]): on Redis this host's clock
//! corrected by its offset to the nodes' clocks, measured first; where there is no clock to read (etcd,
//! the embedded store), this host's own clock, refused when it is further off the live workers' than a
//! worker accepts ([`crate::trigger::MAX_AHEAD`]). Writes a trigger request to a majority of the nodes
//! ([`crate::trigger`]), then follows it in the history:
//! the worker that wins the request records its run under the request's id. Without `--wait` the command
//! returns once the run has started (its id, worker and token); with `--wait`, once it has ended, and exits
//! with the job's exit code. No run within the request's window (`--timeout`, 30 s by default) — no live
//! worker runs the job, the job is paused, another run held it the whole time — is an error that says
//! which, with its own exit code ([`Exit::NoRun`]).
//!
//! A worker of an earlier release never claims a request, so the command first reads the live workers and
//! refuses, naming them, while one of them does not honour triggers ([`super::honoured`]);
//! `--even-if-ignored` writes the request anyway and the report names them.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::honoured::{self, Ignoring};
use super::read::{ReadError, Reader};
use super::{load_job, operator, render, say, say_error, ConfigArg, Exit};
use crate::clock::cluster::ClusterClock;
use crate::config::{show_duration, Config};
use crate::history::tick;
use crate::history::{Entry, Kind, Query};
use crate::inspect::status::alive;
use crate::inspect::story::{describe, gone};
use crate::inspect::time::{self, instant};
use crate::inspect::Notes;
use crate::membership::{Capability, Member};
use crate::trigger::{TriggerRequest, DEFAULT_TIMEOUT, MAX_AHEAD, MAX_WINDOW};

/// How often the history is read while waiting.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How often, while waiting for a run's end, its worker is checked for being alive.
const ALIVE_EVERY: Duration = Duration::from_secs(5);
/// After the window, the time for the workers' last entries (a skip at the window's end) to land.
const SETTLE: Duration = Duration::from_secs(3);
/// The longest `--timeout`: the longest window a worker takes a request with.
const MAX_TIMEOUT: Duration = MAX_WINDOW;

/// Arguments of `trigger`.
#[derive(Debug, clap::Args)]
pub struct TriggerArgs {
    /// The job's name.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// Wait for the run's end, and exit with the job's exit code (128+N if signal N ended it, 1 if it
    /// could not start).
    #[arg(long)]
    pub wait: bool,
    /// How long a worker may take to claim the request (while another run holds the job, the request
    /// waits for it this long); 1s to 1day.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Write the request even if a live worker ignores trigger requests (one of an earlier release, which
    /// announces no `honours`): it never claims it. Without it, such a worker makes `trigger` refuse
    /// (exit 5), naming it.
    #[arg(long)]
    pub even_if_ignored: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON (field names in docs/history.md) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What became of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Verdict {
    /// A worker won it and started the run (without `--wait`).
    Started,
    /// The run ended (`--wait`).
    Ended,
    /// No run came of it.
    NotRun,
    /// The run started, and its worker died before recording its end (`--wait`).
    Unfinished,
}

/// What `trigger` reports. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub(super) struct TriggerReport {
    /// The request as written.
    pub request: TriggerRequest,
    pub verdict: Verdict,
    /// The run's entry, as stored, with `tick_rfc3339`.
    #[serde(serialize_with = "time::entry")]
    pub run: Option<Entry>,
    /// Every entry about the request (the run, and the workers that lost or skipped it), each with
    /// `tick_rfc3339`.
    #[serde(serialize_with = "time::entries")]
    pub entries: Vec<Entry>,
    /// Why no run came of it (`not_run`), or why its end will not come (`unfinished`).
    pub reason: Option<String>,
    /// For `not_run` without any entry: how many workers are alive.
    pub live_workers: Option<usize>,
    /// With `--even-if-ignored`: the live workers that ignore trigger requests (of an earlier release).
    pub ignored_by: Vec<Ignoring>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// Carries out `trigger`.
pub(super) fn run(args: &TriggerArgs) -> anyhow::Result<ExitCode> {
    let (config, job) = match load_job(&args.config, &args.job) {
        Ok(found) => found,
        Err(code) => return Ok(code),
    };
    if !job.enabled {
        say_error(&format!(
            "job {:?} is disabled (enabled: false in {}): no worker runs it; enable it first",
            job.name,
            config.path.display()
        ));
        return Ok(ExitCode::from(Exit::Usage));
    }
    let mut reader = match Reader::open(&config) {
        Ok(reader) => reader,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let ignored_by = match honoured::ignoring(&mut reader, Capability::Trigger) {
        Ok(ignored_by) => ignored_by,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    if !ignored_by.is_empty() && !args.even_if_ignored {
        render::warn_notes(&reader.notes());
        let effect = "it never claims the request, which runs only if another worker claims it";
        say_error(&honoured::refusal(
            "trigger",
            &job.name,
            &ignored_by,
            effect,
        ));
        return Ok(ExitCode::from(Exit::Ignored));
    }
    let clock = match cluster_clock(&mut reader, &config) {
        Ok(Ok(clock)) => clock,
        Ok(Err(refusal)) => {
            say_error(&refusal);
            return Ok(ExitCode::from(Exit::Failure));
        }
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let request = TriggerRequest::new(&job.name, clock.now(), args.timeout, &operator());
    let followed = {
        reader.request_trigger(&request).inspect_err(|error| {
            if matches!(error, ReadError::NoMajority(_)) {
                say_error(&format!(
                    "trigger request {} reached fewer than a majority of the nodes: it may still run \
                     once, if a worker reads it from a node that took it",
                    request.id
                ));
            }
        })
    }
    .and_then(|()| follow(&mut reader, request, args.wait, &clock));
    let mut report = match followed {
        Ok(report) => report,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    report.ignored_by = ignored_by;
    render::deliver(&report, &report.notes, args.json, text)?;
    Ok(ExitCode::from(exit_code(&report)))
}

/// The clock to ask at: cluster time as the workers keep it, or why this host's clock cannot be used.
///
/// On Redis, this host's clock corrected by its offset to the nodes' clocks, measured now as a worker
/// measures it (with a note when the offset is above `worker.max_clock_offset`). Where that cannot be
/// measured (etcd and the embedded store have no clock to read; too few nodes answered `TIME`), this
/// host's own clock, checked against the live workers' newest heartbeat, which each stamps with its own
/// clock on etcd and the embedded store, with the nodes' on Redis: more than [`MAX_AHEAD`] ahead of it
/// (beyond a heartbeat's age), a worker would refuse the request; more than that behind, the request's
/// window could be over on the workers' clocks before it is read. Either is refused, saying by how much.
/// With no live worker there is nothing to compare with, and no worker to run the request anyway.
fn cluster_clock(
    reader: &mut Reader,
    config: &Config,
) -> Result<Result<ClusterClock, String>, ReadError> {
    let clock = ClusterClock::local();
    match reader.measure_clock()? {
        Some(Ok(estimate)) => {
            clock.set(&estimate);
            let offset = Duration::from_micros(estimate.offset_us.unsigned_abs());
            if offset > config.worker.max_clock_offset {
                let side = if estimate.offset_us < 0 {
                    "ahead of"
                } else {
                    "behind"
                };
                say(&format!(
                    "note: this host's clock is {} {side} the nodes' clocks; the request is made at \
                     their time, {}",
                    show_duration(Duration::from_secs(offset.as_secs())),
                    clock.now().to_rfc3339()
                ));
            }
            return Ok(Ok(clock));
        }
        Some(Err(failure)) => say(&format!(
            "note: the nodes' clocks could not be read ({failure}); the request is made at this \
             host's time, checked against the workers' heartbeats"
        )),
        None => {}
    }
    let members = reader.members()?;
    Ok(far_off(Utc::now(), &members).map_or(Ok(clock), Err))
}

/// Why a request made at `now` would not be run by the workers of `members`, judged by the newest
/// heartbeat of a live one: `now` is more than [`MAX_AHEAD`] past the latest time that heartbeat can
/// have been stamped at on a correct clock (a live worker's heartbeat is younger than its TTL), or more
/// than [`MAX_AHEAD`] before it. `None` when it is within, or no worker is alive.
fn far_off(now: DateTime<Utc>, members: &[Member]) -> Option<String> {
    let newest = members
        .iter()
        .filter(|m| m.alive)
        .filter_map(|m| Some((m.seen_at?, m)))
        .max_by_key(|(seen_at, _)| *seen_at)?;
    let (seen_at, member) = newest;
    let ahead = (now - seen_at).to_std().unwrap_or_default();
    let behind = (seen_at - now).to_std().unwrap_or_default();
    let (by, side, what) = if ahead > member.ttl() + MAX_AHEAD {
        (ahead, "ahead of", "refuse it")
    } else if behind > MAX_AHEAD {
        (behind, "behind", "find its window over")
    } else {
        return None;
    };
    Some(format!(
        "this host's clock ({}) is {} {side} the live workers' (the newest heartbeat, of {}, is stamped \
         {}): the workers would {what}; nothing was requested. Fix this host's clock (NTP), or run the \
         command on a worker's host",
        now.to_rfc3339(),
        show_duration(Duration::from_secs(by.as_secs())),
        member.id,
        seen_at.to_rfc3339()
    ))
}

/// Reads the history until the request has a run that started (or ended, with `wait`), or its window and
/// [`SETTLE`] have passed without one on `clock` (the clock it was asked at).
fn follow(
    reader: &mut Reader,
    request: TriggerRequest,
    wait: bool,
    clock: &ClusterClock,
) -> Result<TriggerReport, ReadError> {
    let query = Query {
        job: request.job.clone(),
        since: Some(request.tick()),
        until: Some(request.tick()),
        limit: 1000,
    };
    let settle = chrono::Duration::from_std(SETTLE).unwrap_or_default();
    let mut alive_checked = Instant::now();
    let report = |verdict, entries: Vec<Entry>, reason, live_workers, notes| TriggerReport {
        run: run_of(&entries),
        request: request.clone(),
        verdict,
        entries,
        reason,
        live_workers,
        ignored_by: Vec::new(),
        notes,
    };
    loop {
        reader.renew_deadline();
        let entries: Vec<Entry> = reader
            .histories(std::slice::from_ref(&query))?
            .into_iter()
            .flatten()
            .filter(|e| e.trigger.as_deref() == Some(request.id.as_str()))
            .collect();
        let run = run_of(&entries);
        let paused = entries
            .iter()
            .any(|e| e.kind == Kind::Skipped && e.reason.as_deref() == Some("paused"));
        match run {
            Some(run) if !wait || run.ended_at.is_some() => {
                let verdict = if wait {
                    Verdict::Ended
                } else {
                    Verdict::Started
                };
                return Ok(report(verdict, entries, None, None, reader.notes()));
            }
            Some(run) if alive_checked.elapsed() >= ALIVE_EVERY => {
                alive_checked = Instant::now();
                let members = reader.members()?;
                if !alive(&members, &run.worker) {
                    let why = gone(&members, &run.worker);
                    let verdict = Verdict::Unfinished;
                    return Ok(report(verdict, entries, Some(why), None, reader.notes()));
                }
            }
            Some(_) => {}
            None if paused => {
                let why = "the job is paused (redcron pause; see redcron status)".to_string();
                return Ok(report(
                    Verdict::NotRun,
                    entries,
                    Some(why),
                    None,
                    reader.notes(),
                ));
            }
            None if clock.now() > request.not_after + settle => {
                let live = reader.members()?.iter().filter(|m| m.alive).count();
                let why = not_run(&entries, live, &request);
                let live = entries.is_empty().then_some(live);
                return Ok(report(
                    Verdict::NotRun,
                    entries,
                    Some(why),
                    live,
                    reader.notes(),
                ));
            }
            None => {}
        }
        reader.sleep(POLL_EVERY);
    }
}

/// The run of a request's entries: its record's (the ended one, should two workers have run it), whether
/// the workers that lost it wrote entries (earlier versions) or nothing.
fn run_of(entries: &[Entry]) -> Option<Entry> {
    tick::group(entries.iter().cloned())
        .into_iter()
        .find_map(|record| record.run().cloned())
}

/// Why a request whose window passed has no run.
fn not_run(entries: &[Entry], live: usize, request: &TriggerRequest) -> String {
    let window = crate::config::show_duration(
        (request.not_after - request.requested_at)
            .to_std()
            .unwrap_or_default(),
    );
    if entries.is_empty() && live == 0 {
        return format!("no worker claimed it within {window}: no worker is alive");
    }
    if entries.is_empty() {
        return format!(
            "no worker claimed it within {window}: {live} worker{} alive, but none runs the job \
             (or none reached a majority of the nodes); see redcron status",
            super::plural(live)
        );
    }
    let told: Vec<String> = entries.iter().map(describe).collect();
    format!("nobody ran it within {window}: {}", told.join("; "))
}

/// The exit code for `report`: the job's with `--wait`, [`Exit::NoRun`] when no run came of it.
fn exit_code(report: &TriggerReport) -> Exit {
    match (report.verdict, &report.run) {
        (Verdict::Started, _) => Exit::Ok,
        (Verdict::Ended, Some(run)) => match (run.exit_code, run.signal) {
            (Some(code), _) => u8::try_from(code).map_or(Exit::Failure, Exit::Job),
            (None, Some(signal)) => u8::try_from(128 + signal).map_or(Exit::Failure, Exit::Job),
            (None, None) => Exit::Failure,
        },
        (Verdict::Ended, None) | (Verdict::NotRun | Verdict::Unfinished, _) => Exit::NoRun,
    }
}

/// The report as a few sentences.
fn text(report: &TriggerReport) -> String {
    let request = &report.request;
    let mut out = format!(
        "trigger {} of {} at {}\n",
        request.id,
        request.job,
        instant(request.requested_at)
    );
    if let Some(run) = &report.run {
        out.push_str(&describe(run));
        out.push('\n');
    }
    if let Some(reason) = &report.reason {
        let lead = match report.verdict {
            Verdict::NotRun => "not run: ",
            _ => "",
        };
        out.push_str(&format!("{lead}{reason}\n"));
    }
    if !report.ignored_by.is_empty() {
        out.push_str(&format!(
            "note: {} ignored the request (an earlier release, which never claims one)\n",
            honoured::names(&report.ignored_by)
        ));
    }
    out
}

/// `--timeout`: from a second to a day.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); expected e.g. 30s, 5m, 1h"))?;
    if timeout < Duration::from_secs(1) || timeout > MAX_TIMEOUT {
        return Err(format!(
            "{text:?}: the timeout is at least 1s and at most 1day (default {})",
            crate::config::show_duration(DEFAULT_TIMEOUT)
        ));
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_far_off_the_live_workers_heartbeats_is_refused() {
        let seen = DateTime::from_timestamp_millis(1_795_436_805_123).unwrap_or_default();
        let member = |id: &str, seen_at, alive| -> Member {
            let json = format!(
                r#"{{"id":"{id}","started_at":"2026-11-23T10:00:00Z","heartbeat_ms":5000,"alive":{alive}}}"#
            );
            let mut member: Member = serde_json::from_str(&json).expect("a member");
            member.seen_at = Some(seen_at);
            member
        };
        let old = seen - chrono::Duration::hours(1);
        let members = [member("a", old, true), member("b", seen, true)];
        let at = |seconds| seen + chrono::Duration::seconds(seconds);
        // Three heartbeats (15 s) and MAX_AHEAD (10 s) past the newest: still a clock the workers share.
        assert_eq!(far_off(at(25), &members), None);
        assert_eq!(far_off(at(-10), &members), None);
        let ahead = far_off(at(26), &members).expect("refused");
        assert!(ahead.contains("26s ahead of the live workers'"), "{ahead}");
        assert!(ahead.contains("of b,"), "{ahead}");
        let behind = far_off(at(-11), &members).expect("refused");
        assert!(behind.contains("11s behind"), "{behind}");
        // A dead worker's heartbeat says nothing; with none alive there is nothing to compare with.
        assert_eq!(far_off(at(-11), &[member("b", seen, false)]), None);
        let year_2300 = "2300-01-01T00:00:00Z".parse().unwrap_or(seen);
        assert!(far_off(year_2300, &members).is_some());
    }

    /// The request's run is found whether its losers wrote entries (earlier versions) or nothing (the
    /// winner names them); of two runs, the ended one.
    #[test]
    fn the_run_is_the_records_whoever_wrote_entries() {
        let entry = |worker: &str, kind| {
            let mut entry = Entry::new("j", crate::schedule::Tick(5), worker, kind, Utc::now());
            entry.trigger = Some("abc".to_string());
            entry
        };
        let mut ended = entry("w2", Kind::Run);
        ended.ended_at = Some(Utc::now());
        let legacy = [
            entry("w1", Kind::Lost),
            ended.clone(),
            entry("w3", Kind::Lost),
        ];
        assert_eq!(run_of(&legacy).map(|r| r.worker), Some("w2".to_string()));
        assert_eq!(run_of(std::slice::from_ref(&ended)), Some(ended.clone()));
        let double = [entry("w1", Kind::Run), ended.clone()];
        assert_eq!(run_of(&double), Some(ended));
        assert_eq!(run_of(&[entry("w1", Kind::Skipped)]), None);
    }

    #[test]
    fn timeout_is_a_second_to_a_day() {
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert!(parse_timeout("500ms").is_err());
        assert!(parse_timeout("2days").is_err());
        assert!(parse_timeout("x")
            .expect_err("no")
            .contains("is not a duration"));
    }
}
