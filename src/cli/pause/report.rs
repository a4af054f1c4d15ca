//! What `pause` and `resume` report: each job's change, as a sentence for a person or as JSON (field
//! names stable: docs/history.md), and the exit code the report implies.

use std::process::ExitCode;

use serde::Serialize;

use super::{took_effect, Changed, Done};
use crate::cli::honoured::{self, Ignoring};
use crate::cli::{render, say_error, Exit};
use crate::inspect::time::instant;
use crate::inspect::Notes;
use crate::lock::{Pause, PauseOutcome, PauseRead};

/// What `pause` and `resume` report of one job. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub(super) struct JobChange {
    pub job: String,
    pub action: Action,
    /// For `resume`: whether a node held a pause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_paused: Option<bool>,
    /// The pause as read back after the write (`null` once resumed), with on how many nodes it stands.
    pub paused: Option<PauseRead>,
    /// Set when the pauses could not be read back: the store stopped answering after the change (of
    /// several jobs, at a later job); `paused` then says nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_read_back: bool,
    /// Whether the control's `control` entry reached the history (a majority of the nodes); absent when
    /// nothing changed, so nothing was to be recorded. `false` does not undo the control.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_in_history: Option<bool>,
}

/// What `pause JOB` and `resume JOB` report: the one job's change. Field names are stable
/// (docs/history.md).
#[derive(Debug, Serialize)]
pub(super) struct PauseReport {
    #[serde(flatten)]
    pub change: JobChange,
    /// How many nodes the store has.
    pub configured_nodes: usize,
    /// For `pause --even-if-ignored`: the live workers that ignore the pause (of an earlier release).
    pub ignored_by: Vec<Ignoring>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// What `pause` and `resume` of several jobs (or `--all`) report. Field names are stable
/// (docs/history.md).
#[derive(Debug, Serialize)]
pub(super) struct BulkReport {
    /// Each job changed (or found as it was asked to be), in the order they were changed.
    pub jobs: Vec<JobChange>,
    /// The jobs not changed, in order, each with why: a pause whose `--for` had ended when it reached
    /// the store, or the store failing (then every job after it is listed too, and the command exits
    /// with the failure's code).
    pub not_changed: Vec<NotChanged>,
    /// How many nodes the store has.
    pub configured_nodes: usize,
    /// For `pause --even-if-ignored`: the live workers that ignore the pause (of an earlier release).
    pub ignored_by: Vec<Ignoring>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// A job that `pause` or `resume` of several jobs left as it was, and why.
#[derive(Debug, Serialize)]
pub(super) struct NotChanged {
    pub job: String,
    pub why: String,
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

/// One job's report, as the command gave it before it took several: a pause over before it landed is
/// an error (exit 2).
pub(super) fn report_one(
    done: Done,
    configured_nodes: usize,
    notes: Notes,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Done {
        changed,
        paused,
        recorded,
        ignored_by,
        ..
    } = done;
    let (Some((job, change)), Some(paused)) = (
        changed.into_iter().next(),
        paused.and_then(|paused| paused.into_iter().next()),
    ) else {
        anyhow::bail!("no job was changed");
    };
    let change = match job_change(job, change, Some(paused), recorded) {
        Ok(change) => change,
        Err(why) => {
            render::warn_notes(&notes);
            say_error(&why);
            return Ok(ExitCode::from(Exit::Usage));
        }
    };
    let report = PauseReport {
        change,
        configured_nodes,
        ignored_by,
        notes,
    };
    render::deliver(&report, &report.notes, json, |report| {
        let mut text = sentence(&report.change, report.configured_nodes);
        if stops_claims(&report.change) {
            text.push_str(&starts(&report.ignored_by, "it", "until then"));
            text.push('\n');
        }
        text
    })
}

/// The report of several jobs: each job's change, then those not changed; exits with the store's
/// failure's code if one stopped the command, else 2 if a pause was over before it landed, else 0.
pub(super) fn report_bulk(
    done: Done,
    configured_nodes: usize,
    notes: Notes,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Done {
        changed,
        stopped,
        paused,
        recorded,
        ignored_by,
    } = done;
    let mut jobs = Vec::with_capacity(changed.len());
    let mut not_changed = Vec::new();
    let read_back: Vec<Option<Option<PauseRead>>> = match paused {
        Some(paused) => paused.into_iter().map(Some).collect(),
        None => changed.iter().map(|_| None).collect(),
    };
    for ((job, change), paused) in changed.into_iter().zip(read_back) {
        match job_change(job.clone(), change, paused, recorded) {
            Ok(change) => jobs.push(change),
            Err(why) => not_changed.push(NotChanged { job, why }),
        }
    }
    let over_before_landing = !not_changed.is_empty();
    let mut exit = Exit::Ok;
    if over_before_landing {
        exit = Exit::Usage;
    }
    if let Some((error, left)) = &stopped {
        exit = error.exit_code();
        let why = format!("not changed: {error}");
        not_changed.extend(left.iter().map(|job| NotChanged {
            job: job.clone(),
            why: why.clone(),
        }));
    }
    let report = BulkReport {
        jobs,
        not_changed,
        configured_nodes,
        ignored_by,
        notes,
    };
    render::deliver(&report, &report.notes, json, bulk_text)?;
    if let Some((error, left)) = &stopped {
        say_error(&format!(
            "{error}; stopped there: {} of {} jobs not changed ({})",
            left.len(),
            report.jobs.len() + report.not_changed.len(),
            names_text(left),
        ));
    } else if over_before_landing {
        say_error(
            "some pauses were not written: their --for had ended before they reached the store",
        );
    }
    Ok(ExitCode::from(exit))
}

/// A job's change as reported, or why nothing was written: a pause that had ended before it landed.
/// `paused` is the pause read back after the change, `None` if it could not be read back.
fn job_change(
    job: String,
    change: Changed,
    paused: Option<Option<PauseRead>>,
    recorded: Option<bool>,
) -> Result<JobChange, String> {
    let not_read_back = paused.is_none();
    let paused = paused.flatten();
    let recorded_in_history = recorded.filter(|_| took_effect(&change));
    let (action, was_paused) = match change {
        Changed::Paused(PauseOutcome::AlreadyOver) => return Err(over(&job, paused.as_ref())),
        Changed::Paused(PauseOutcome::LongerKept(_)) => (Action::Kept, None),
        Changed::Paused(PauseOutcome::Paused) => (Action::Paused, None),
        Changed::Resumed { was_paused } => (Action::Resumed, Some(was_paused)),
    };
    Ok(JobChange {
        job,
        action,
        was_paused,
        paused,
        not_read_back,
        recorded_in_history,
    })
}

/// `a`, `a and b`, `a, b and c`; past ten names, the first ten and how many more.
pub(super) fn names_text(names: &[String]) -> String {
    const SHOWN: usize = 10;
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] if names.len() <= SHOWN => format!("{} and {last}", rest.join(", ")),
        _ => format!(
            "{} and {} more",
            names[..SHOWN].join(", "),
            names.len() - SHOWN
        ),
    }
}

/// Whether the report says that a pause stands now (then what it stops is said too).
fn stops_claims(change: &JobChange) -> bool {
    (change.paused.is_some() || change.not_read_back && change.action == Action::Paused)
        && change.was_paused.is_none()
}

/// The report of several jobs as text: a line per job changed, what the pauses stop, and a line per job
/// not changed.
fn bulk_text(report: &BulkReport) -> String {
    let mut text = String::new();
    for change in &report.jobs {
        text.push_str(&sentence(change, report.configured_nodes));
    }
    if report.jobs.iter().any(stops_claims) {
        text.push_str(&starts(
            &report.ignored_by,
            "a paused job",
            "while its pause stands",
        ));
        text.push('\n');
    }
    for left in &report.not_changed {
        text.push_str(&format!("{}: {}\n", left.job, left.why));
    }
    text
}

/// What happened to one job, as a line.
fn sentence(change: &JobChange, configured_nodes: usize) -> String {
    // A store of one node (an SQL server, the embedded file) has no majority to count.
    let nodes = |read: &PauseRead| match configured_nodes {
        1 => "the store".to_string(),
        n => format!("{} of {n} nodes", read.nodes),
    };
    let job = &change.job;
    if change.not_read_back {
        let done = match change.action {
            Action::Paused => "paused",
            Action::Kept => "kept the longer pause of",
            Action::Resumed => "resumed",
        };
        return format!(
            "{done} {job} (a majority took it; not read back: the store stopped answering)\n"
        );
    }
    match (change.action, &change.paused, change.was_paused) {
        (Action::Kept, Some(read), _) => format!(
            "{job} stays paused {} (by {}, on {}){}: that pause lasts longer than the one asked \
             for, which does not shorten it (`redcron pause {job} --replace` does)\n",
            until_text(&read.pause),
            read.pause.by,
            nodes(read),
            reason_text(&read.pause),
        ),
        (Action::Kept, None, _) => format!(
            "{job}: a longer pause was in force and was kept, but it is gone already (it ended, or \
             was resumed)\n"
        ),
        (_, Some(read), None) => format!(
            "paused {job} {} (by {}, on {}){}\n",
            until_text(&read.pause),
            read.pause.by,
            nodes(read),
            reason_text(&read.pause),
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

/// What the pause in force stops — every tick of `what` (`it`, `a paused job`) for `how_long` (`until
/// then`, `while its pause stands`), or every tick but on the workers that ignore it.
fn starts(ignored_by: &[Ignoring], what: &str, how_long: &str) -> String {
    let starts = match ignored_by {
        [] => format!("no claim of {what} is granted anywhere {how_long} (a tick granted just before may still start)"),
        ignoring => format!(
            "no tick of {what} starts {how_long}, except on {}: of an earlier release, it ignores \
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Of several jobs, those changed before the store stopped answering — the read-back too — are
    /// reported as changed and not read back, in the text and the JSON, and what a pause stops is said.
    #[test]
    fn a_change_not_read_back_is_reported_as_done_and_unread() {
        let paused = Changed::Paused(PauseOutcome::Paused);
        let change = job_change("alpha".into(), paused, None, Some(false)).expect("a change");
        assert!(change.not_read_back && change.paused.is_none());
        let json = serde_json::to_value(&change).expect("JSON");
        assert_eq!(json["not_read_back"], true, "{json}");
        let report = BulkReport {
            jobs: vec![change],
            not_changed: vec![NotChanged {
                job: "beta".into(),
                why: "not changed: no majority".into(),
            }],
            configured_nodes: 3,
            ignored_by: Vec::new(),
            notes: Notes::default(),
        };
        let text = bulk_text(&report);
        assert!(
            text.starts_with(
                "paused alpha (a majority took it; not read back: the store stopped answering)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("no claim of a paused job is granted"),
            "{text}"
        );
        assert!(text.ends_with("beta: not changed: no majority\n"), "{text}");
        let read = job_change(
            "alpha".into(),
            Changed::Resumed { was_paused: true },
            Some(None),
            None,
        );
        let json = serde_json::to_value(read.expect("a change")).expect("JSON");
        assert!(
            json.get("not_read_back").is_none(),
            "only said when set: {json}"
        );
    }
}
