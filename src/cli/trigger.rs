//! `redcron trigger JOB [--wait] [--timeout DURATION]`: one extra run of a job now, through the lock.
//!
//! Writes a trigger request to a majority of the nodes ([`crate::trigger`]), then follows it in the history:
//! the worker that wins the request records its run under the request's id. Without `--wait` the command
//! returns once the run has started (its id, worker and token); with `--wait`, once it has ended, and exits
//! with the job's exit code. No run within the request's window (`--timeout`, 30 s by default) — no live
//! worker runs the job, the job is paused, another run held it the whole time — is an error that says
//! which, with its own exit code ([`super::EXIT_NO_RUN`]).
//!
//! A worker of an earlier release never claims a request, so the command first reads the live workers and
//! refuses, naming them, while one of them does not honour triggers ([`super::honoured`]);
//! `--even-if-ignored` writes the request anyway and the report names them.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;

use super::honoured::{self, Ignoring};
use super::read::{Notes, ReadError, Reader};
use super::status::alive;
use super::story::{describe, gone};
use super::{
    load_job, operator, render, say_error, ConfigArg, EXIT_IGNORED, EXIT_NO_RUN, EXIT_USAGE,
};
use crate::history::{Entry, Kind, Query};
use crate::membership::Capability;
use crate::trigger::{TriggerRequest, DEFAULT_TIMEOUT};

/// How often the history is read while waiting.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How often, while waiting for a run's end, its worker is checked for being alive.
const ALIVE_EVERY: Duration = Duration::from_secs(5);
/// After the window, the time for the workers' last entries (a skip at the window's end) to land.
const SETTLE: Duration = Duration::from_secs(3);
/// The longest `--timeout`: the longest window a worker takes a request with.
const MAX_TIMEOUT: Duration = crate::trigger::MAX_WINDOW;

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
    /// The run's entry, as stored.
    pub run: Option<Entry>,
    /// Every entry about the request (the run, and the workers that lost or skipped it).
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
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let request = TriggerRequest::new(&job.name, Utc::now(), args.timeout, &operator());
    let followed = Reader::open(&config).and_then(|mut reader| {
        let ignored_by = honoured::ignoring(&mut reader, Capability::Trigger)?;
        if !ignored_by.is_empty() && !args.even_if_ignored {
            return Ok(Err((ignored_by, reader.notes())));
        }
        reader.request_trigger(&request).inspect_err(|error| {
            if matches!(error, ReadError::NoMajority(_)) {
                say_error(&format!(
                    "trigger request {} reached fewer than a majority of the nodes: it may still run \
                     once, if a worker reads it from a node that took it",
                    request.id
                ));
            }
        })?;
        let mut report = follow(&mut reader, request, args.wait)?;
        report.ignored_by = ignored_by;
        Ok(Ok(report))
    });
    let report = match followed {
        Ok(Ok(report)) => report,
        Ok(Err((ignoring, notes))) => {
            render::warn_notes(&notes);
            let effect = "it never claims the request, which runs only if another worker claims it";
            say_error(&honoured::refusal("trigger", &job.name, &ignoring, effect));
            return Ok(ExitCode::from(EXIT_IGNORED));
        }
        Err(error) => return Ok(super::read_failed(&error)),
    };
    render::deliver(&report, &report.notes, args.json, text)?;
    Ok(ExitCode::from(exit_code(&report)))
}

/// Reads the history until the request has a run that started (or ended, with `wait`), or its window and
/// [`SETTLE`] have passed without one.
fn follow(
    reader: &mut Reader,
    request: TriggerRequest,
    wait: bool,
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
        run: entries.iter().find(|e| e.kind == Kind::Run).cloned(),
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
        let run = entries.iter().find(|e| e.kind == Kind::Run);
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
            None if Utc::now() > request.not_after + settle => {
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

/// The exit code for `report`: the job's with `--wait`, [`EXIT_NO_RUN`] when no run came of it.
fn exit_code(report: &TriggerReport) -> u8 {
    match (report.verdict, &report.run) {
        (Verdict::Started, _) => super::EXIT_OK,
        (Verdict::Ended, Some(run)) => match (run.exit_code, run.signal) {
            (Some(code), _) => u8::try_from(code).unwrap_or(super::EXIT_FAILURE),
            (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(super::EXIT_FAILURE),
            (None, None) => super::EXIT_FAILURE,
        },
        (Verdict::Ended, None) | (Verdict::NotRun | Verdict::Unfinished, _) => EXIT_NO_RUN,
    }
}

/// The report as a few sentences.
fn text(report: &TriggerReport) -> String {
    let request = &report.request;
    let mut out = format!(
        "trigger {} of {} at {}\n",
        request.id,
        request.job,
        render::instant(request.requested_at)
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
    fn timeout_is_a_second_to_a_day() {
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert!(parse_timeout("500ms").is_err());
        assert!(parse_timeout("2days").is_err());
        assert!(parse_timeout("x")
            .expect_err("no")
            .contains("is not a duration"));
    }
}
