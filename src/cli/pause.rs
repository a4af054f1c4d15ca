//! `redcron pause JOB [--for DURATION] [--reason TEXT]` and `redcron resume JOB`: stop and restart a job's
//! ticks through the lock.
//!
//! `pause` writes the job's pause to every node and succeeds once a majority took it; from then on both
//! rounds of every claim refuse, so no tick of the job is granted anywhere — also on a worker that has not
//! heard of the pause — and the workers record its ticks as skipped (`paused`), never as missed. Runs under
//! way go on. `--for` gives the pause a TTL on each node, so it ends by itself. `resume` deletes it on every
//! node. Both then read the pause back, so the report says on how many nodes it stands.
//!
//! A pause never shortens a pause in force: a shorter `--for` leaves a longer pause (or one without end)
//! as it is, and says so, unless `--replace`; a pause that had ended when it reached the store (`--for
//! 1ms`) is not written, and is an error ([`crate::lock::Pause::decide`], atomic in every store).
//!
//! A pause written and a resume that lifted one are recorded in the job's history as a `control` entry
//! (action, by, reason, until, stamped with cluster time: docs/history.md), so `redcron history` answers
//! who paused or resumed a job and why. A pause kept out by a longer one, or a resume of a job that was
//! not paused, changed nothing and records nothing. A failed history write does not undo the control or
//! change the exit code: the command warns on stderr and the JSON says `recorded_in_history: false`.
//!
//! A worker of an earlier release ignores pauses (its claim scripts never read the key), so `pause` first
//! reads the live workers and refuses, naming them, while one of them does not honour it
//! ([`super::honoured`]); `--even-if-ignored` pauses anyway and the report names them.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::honoured::{self, Ignoring};
use super::read::{ReadError, Reader};
use super::{load_job, operator, render, say, say_error, ConfigArg, Exit};
use crate::history::{Control, Entry};
use crate::inspect::time::instant;
use crate::inspect::Notes;
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead};
use crate::membership::Capability;

/// The writer (`worker`) of the `control` entries the command line records.
const CONTROL_WRITER: &str = "cli";

/// The longest `--for`: a pause meant to last longer is a pause until `resume`.
const MAX_FOR: Duration = Duration::from_secs(366 * 24 * 3600);

/// Arguments of `pause`.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// The job's name.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// End the pause by itself after this long (90s, 30m, 2h, 1day; at most a year). Default: until
    /// `redcron resume`. A pause in force that lasts longer stays as it is (unless --replace); a pause
    /// that has ended by the time it reaches the store is not written (exit 2).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_for)]
    pub duration: Option<Duration>,
    /// Replace a pause in force even if it lasts longer than this one (by default a shorter pause
    /// leaves it as it is, and says so).
    #[arg(long)]
    pub replace: bool,
    /// Why, for `status` and the workers' `tick.skipped` events.
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub reason: String,
    /// Pause even if a live worker ignores pauses (one of an earlier release, which announces no
    /// `honours`): it goes on running the job's ticks. Without it, such a worker makes `pause` refuse
    /// (exit 5), naming it.
    #[arg(long)]
    pub even_if_ignored: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `resume`.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The job's name.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// Why, for the history's record of the resume.
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `pause` and `resume` report. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub(super) struct PauseReport {
    pub job: String,
    pub action: Action,
    /// For `resume`: whether a node held a pause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_paused: Option<bool>,
    /// The pause as read back after the write (`null` once resumed), with on how many nodes it stands.
    pub paused: Option<PauseRead>,
    /// How many nodes the store has.
    pub configured_nodes: usize,
    /// For `pause --even-if-ignored`: the live workers that ignore the pause (of an earlier release).
    pub ignored_by: Vec<Ignoring>,
    /// Whether the control's `control` entry reached the history (a majority of the nodes); absent when
    /// nothing changed, so nothing was to be recorded. `false` does not undo the control.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_in_history: Option<bool>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// What `pause` or `resume` did, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Action {
    /// The pause was written.
    Paused,
    /// A pause in force lasts longer than the one asked for, and stays as it was.
    Kept,
    /// The pause was deleted.
    Resumed,
}

/// What the change did.
enum Changed {
    /// The pause written, kept out by a longer one, or over; `ignored_by` are the live workers that
    /// ignore it (only with `--even-if-ignored`).
    Paused {
        outcome: PauseOutcome,
        ignored_by: Vec<Ignoring>,
    },
    /// Resumed: whether a node held a pause.
    Resumed { was_paused: bool },
    /// Nothing written: these live workers would ignore the pause.
    Refused(Vec<Ignoring>),
}

/// Carries out `pause`.
pub(super) fn pause(args: &PauseArgs) -> anyhow::Result<ExitCode> {
    let pause = Pause {
        until: args.duration.map(|duration| until(Utc::now(), duration)),
        by: operator(),
        reason: args.reason.clone(),
    };
    let control = Control::paused(&pause);
    change(
        &args.config,
        &args.job,
        args.json,
        control,
        |reader, job| {
            let ignored_by = honoured::ignoring(reader, Capability::Pause)?;
            if !ignored_by.is_empty() && !args.even_if_ignored {
                return Ok(Changed::Refused(ignored_by));
            }
            let in_force = match args.replace {
                true => InForce::Replace,
                false => InForce::KeepLonger,
            };
            let outcome = reader.pause(job, &pause, in_force)?;
            Ok(Changed::Paused {
                outcome,
                ignored_by,
            })
        },
    )
}

/// Carries out `resume`.
pub(super) fn resume(args: &ResumeArgs) -> anyhow::Result<ExitCode> {
    // Never refused for a worker that ignores pauses: it ignored the pause too, so it ran the job all
    // along and goes on doing so; the resume lets every other worker run it again, which is all it says.
    let control = Control::resumed(operator(), args.reason.clone());
    change(
        &args.config,
        &args.job,
        args.json,
        control,
        |reader, job| {
            let was_paused = reader.resume(job)?;
            Ok(Changed::Resumed { was_paused })
        },
    )
}

/// Loads the config, finds the job, makes the change (`write`), records `control` in the history if the
/// change took effect, reads the pause back and reports it; or says why nothing was written.
fn change(
    config: &ConfigArg,
    name: &str,
    json: bool,
    control: Control,
    write: impl FnOnce(&mut Reader, &str) -> Result<Changed, ReadError>,
) -> anyhow::Result<ExitCode> {
    let (config, job) = match load_job(config, name) {
        Ok((config, job)) => (config, job.name),
        Err(code) => return Ok(code),
    };
    let configured_nodes = config.store.nodes();
    let mut recorded_in_history = None;
    let done = Reader::open(&config).and_then(|mut reader| {
        let changed = write(&mut reader, &job)?;
        if matches!(changed, Changed::Refused(_)) {
            return Ok((changed, None, reader.notes()));
        }
        let paused = reader.pauses(std::slice::from_ref(&job))?.pop().flatten();
        // After the read-back, with a deadline of its own: however the history write fares, the report
        // of the change is what it would have been without it.
        if took_effect(&changed) {
            reader.renew_deadline();
            recorded_in_history = Some(record(&mut reader, &job, &control));
        }
        Ok((changed, paused, reader.notes()))
    });
    let (changed, paused, notes) = match done {
        Ok(done) => done,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let (action, was_paused, ignored_by) = match changed {
        Changed::Paused {
            outcome: PauseOutcome::AlreadyOver,
            ..
        } => {
            render::warn_notes(&notes);
            say_error(&over(&job, paused.as_ref()));
            return Ok(ExitCode::from(Exit::Usage));
        }
        Changed::Paused {
            outcome: PauseOutcome::LongerKept(_),
            ignored_by,
        } => (Action::Kept, None, ignored_by),
        Changed::Paused {
            outcome: PauseOutcome::Paused,
            ignored_by,
        } => (Action::Paused, None, ignored_by),
        Changed::Resumed { was_paused } => (Action::Resumed, Some(was_paused), Vec::new()),
        Changed::Refused(ignoring) => {
            render::warn_notes(&notes);
            let effect = format!("it would go on running {job}'s ticks while paused");
            say_error(&honoured::refusal("pause", &job, &ignoring, &effect));
            return Ok(ExitCode::from(Exit::Ignored));
        }
    };
    let report = PauseReport {
        action,
        job,
        was_paused,
        paused,
        configured_nodes,
        ignored_by,
        recorded_in_history,
        notes,
    };
    render::deliver(&report, &report.notes, json, text)
}

/// Whether the change is one the history records: a pause written, or a resume that lifted a pause.
fn took_effect(changed: &Changed) -> bool {
    matches!(
        changed,
        Changed::Paused {
            outcome: PauseOutcome::Paused,
            ..
        } | Changed::Resumed { was_paused: true }
    )
}

/// Records `control` of `job` in the history, stamped with cluster time; whether a majority took it. A
/// failure is a warning, not an error: the control itself is done and stays done.
fn record(reader: &mut Reader, job: &str, control: &Control) -> bool {
    let entry = Entry::control(job, control, CONTROL_WRITER, reader.cluster_now());
    match reader.record(std::slice::from_ref(&entry)) {
        Ok(()) => true,
        Err(error) => {
            say(&format!(
                "warning: {job} was {} as reported below, but the history does not record it: {error}",
                control.action
            ));
            false
        }
    }
}

/// The report as a sentence or two.
fn text(report: &PauseReport) -> String {
    let nodes = |read: &PauseRead| format!("{} of {} nodes", read.nodes, report.configured_nodes);
    let job = &report.job;
    match (report.action, &report.paused, report.was_paused) {
        (Action::Kept, Some(read), _) => format!(
            "{job} stays paused {} (by {}, on {}){}: that pause lasts longer than the one asked \
             for, which does not shorten it (`redcron pause {job} --replace` does)\n{}\n",
            until_text(&read.pause),
            read.pause.by,
            nodes(read),
            reason_text(&read.pause),
            starts(report),
        ),
        (Action::Kept, None, _) => format!(
            "{job}: a longer pause was in force and was kept, but it is gone already (it ended, or \
             was resumed)\n"
        ),
        (_, Some(read), None) => format!(
            "paused {job} {} (by {}, on {}){}\n{}\n",
            until_text(&read.pause),
            read.pause.by,
            nodes(read),
            reason_text(&read.pause),
            starts(report),
        ),
        (_, Some(read), Some(_)) => format!(
            "resumed {job}, but a pause is still on {}: run `redcron resume {job}` again\n",
            nodes(read),
        ),
        (_, None, Some(true)) => format!("resumed {job}: its next tick runs\n"),
        (_, None, Some(false)) => format!("{job} was not paused\n"),
        // Written to a majority, then gone: it expired, or a `resume` came in between.
        (_, None, None) => {
            format!("paused {job}, but the pause is gone already (it ended, or was resumed)\n")
        }
    }
}

/// `until <instant>`, or `until `redcron resume``.
fn until_text(pause: &Pause) -> String {
    pause
        .until
        .map_or("until `redcron resume`".to_string(), |t| {
            format!("until {}", instant(t))
        })
}

/// `: <reason>`, or nothing.
fn reason_text(pause: &Pause) -> String {
    match pause.reason.as_str() {
        "" => String::new(),
        reason => format!(": {reason}"),
    }
}

/// What the pause in force stops: every tick, or every tick but on the workers that ignore it.
fn starts(report: &PauseReport) -> String {
    let starts = match report.ignored_by.as_slice() {
        [] => "no claim of it is granted anywhere until then (a tick granted just before may still start)".to_string(),
        ignoring => format!(
            "no tick of it starts until then, except on {}: of an earlier release, it ignores \
             pauses and goes on running the job's ticks",
            honoured::names(ignoring)
        ),
    };
    format!("{starts}; runs under way go on")
}

/// Why a pause that had ended when it reached the store was not written, and what stands instead.
fn over(job: &str, standing: Option<&PauseRead>) -> String {
    let standing = match standing {
        Some(read) => format!(
            "; the pause in force stays {} (by {})",
            until_text(&read.pause),
            read.pause.by
        ),
        None => format!("; {job} is not paused"),
    };
    format!(
        "not paused: the pause asked for had ended by the time it reached the store (its --for is \
         shorter than the command took), so nothing was written{standing}; pause for longer, or use \
         `redcron resume` to end a pause now"
    )
}

/// When a pause of `duration` from `now` ends.
fn until(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(duration).unwrap_or_default()
}

/// `--for`: a duration above zero and at most a year.
pub(crate) fn parse_for(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("{text:?} is not a duration ({e}); expected e.g. 90s, 30m, 2h, 1day")
    })?;
    if duration.is_zero() || duration > MAX_FOR {
        return Err(format!(
            "{text:?}: a pause lasts more than zero and at most a year; leave --for out to pause until `redcron resume`"
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_takes_a_positive_duration_of_at_most_a_year() {
        assert_eq!(parse_for("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_for(" 2h "), Ok(Duration::from_secs(7200)));
        assert!(parse_for("0s")
            .expect_err("zero")
            .contains("more than zero"));
        assert!(parse_for("2years").is_err());
        assert!(parse_for("soon")
            .expect_err("not a duration")
            .contains("is not a duration"));
    }
}
