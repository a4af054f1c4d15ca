//! How `status`, `history` and `explain` print what they found: plain-text tables for a person, or JSON.
//!
//! The reports are the [`crate::inspect`] model's plain values (serialized as they are for `--json`); the
//! tables here can change without touching the reading or the reasoning. Tables are aligned plain text:
//! columns two spaces apart, times in UTC as RFC 3339 (what `explain` takes), no colours, no crate.
//!
//! Much of what they print came from outside — a job's output, a pause's reason and `by`, worker names
//! and hosts, a node's error — and reaches a terminal: every control character in it is shown as a
//! visible escape ([`visible`]). Each table cell and each line of a story or an output tail is escaped
//! whole, newlines included (a reason's newline must not forge a row), and the finished text once more
//! line by line, so nothing added later can slip through. The JSON forms escape by being JSON.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{emit, say, Exit};
use crate::history::tick::TickRecord;
use crate::history::{Entry, Kind};
use crate::inspect::explain::Explanation;
use crate::inspect::history::History;
use crate::inspect::status::Status;
use crate::inspect::story::pause_note;
use crate::inspect::time::{duration_ms, instant, instant_ms};
use crate::inspect::Notes;
use crate::logging::{visible, visible_lines};
use crate::store::GroupState;

/// Prints the warnings of `notes` to stderr, then `report` to stdout: as JSON with `json`, else as
/// `human` renders it.
pub(super) fn deliver<T: Serialize>(
    report: &T,
    notes: &Notes,
    json: bool,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<ExitCode> {
    warn_notes(notes);
    let text = if json {
        let mut text = serde_json::to_string_pretty(report)?;
        text.push('\n');
        text
    } else {
        visible_lines(&human(report))
    };
    emit(&text)?;
    Ok(ExitCode::from(Exit::Ok))
}

/// Prints the warnings of `notes` to stderr, one line each.
pub(super) fn warn_notes(notes: &Notes) {
    for warning in warnings(notes) {
        say(&format!("warning: {}", visible(&warning)));
    }
}

/// One line per node that did not answer and per item that could not be read.
fn warnings(notes: &Notes) -> Vec<String> {
    let mut lines = Vec::new();
    for missing in &notes.missing_nodes {
        lines.push(format!(
            "node {} did not answer ({}); answered from a majority of the others",
            missing.node, missing.error
        ));
    }
    lines.extend(notes.skipped.iter().cloned());
    lines
}

/// A Sentinel group's line under `store:`: its master as the reads found it.
fn group_line(group: &GroupState) -> String {
    let master = match &group.master {
        Some(master) => format!("master {}", visible(master)),
        None => "no master reached".to_string(),
    };
    format!("  group {}: {master}", visible(&group.group))
}

/// `status` as two tables, workers then jobs.
pub(super) fn status(status: &Status) -> String {
    let mut out = format!("store: {}\n", visible(&status.notes.store));
    for group in &status.notes.groups {
        out.push_str(&format!("{}\n", group_line(group)));
    }
    out.push_str(&format!(
        "config: {}, fingerprint {}\n\n",
        visible(&status.config.path),
        status.config.fingerprint
    ));
    let mut workers = Table::new(&[
        "WORKER",
        "STATE",
        "LAST SEEN",
        "HOST",
        "PID",
        "VERSION",
        "OFFSET",
        "CONFIG",
        "RUNNING",
    ]);
    for worker in &status.workers {
        let m = &worker.member;
        let state = match (m.alive, m.state.as_str()) {
            (true, _) => "alive".to_string(),
            (false, "stopped") => "stopped".to_string(),
            (false, _) => "dead".to_string(),
        };
        let config = match (worker.runs_this_config, worker.config_differs) {
            _ if m.config_fingerprint.is_empty() => "?".to_string(),
            (true, false) => format!("{} (this config)", m.config_fingerprint),
            (true, true) => format!("{} (this config, DIFFERS)", m.config_fingerprint),
            (false, true) => format!("{} DIFFERS", m.config_fingerprint),
            (false, false) => m.config_fingerprint.clone(),
        };
        // A worker that is gone runs nothing: what its last announcement listed ended with it.
        let running: Vec<String> = m
            .running
            .iter()
            .filter(|_| m.alive)
            .map(|r| format!("{}@{}#{}", r.job, instant_ms(r.tick), r.token))
            .collect();
        workers.row(vec![
            m.id.clone(),
            state,
            m.seen_at.map_or("-".to_string(), |t| ago(status.now, t)),
            m.host.clone(),
            m.pid.to_string(),
            m.version.clone(),
            m.clock_offset_ms
                .map_or("-".to_string(), |ms| format!("{ms:+}ms")),
            config,
            or_dash(running.join(" ")),
        ]);
        // Other processes under the same id (the store keeps one record per id; its writer lists them).
        for sharer in m.shared_with.iter().filter(|_| m.alive) {
            workers.row(vec![
                m.id.clone(),
                "SHARES ID".to_string(),
                ago(status.now, sharer.seen_at),
                sharer.host.clone(),
                sharer.pid.to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
            ]);
        }
    }
    let shared: Vec<&str> = status
        .workers
        .iter()
        .filter(|w| w.member.alive && !w.member.shared_with.is_empty())
        .map(|w| w.member.id.as_str())
        .collect();
    if status.workers.is_empty() {
        out.push_str("no workers announced in the last 24 hours\n");
    } else {
        out.push_str(&workers.render());
    }
    for id in shared {
        out.push_str(&format!(
            "WARNING: several live processes announce themselves as worker {}: give each its own worker.id (or none: the default is unique)\n",
            visible(id)
        ));
    }
    out.push('\n');
    let mut jobs = Table::new(&[
        "JOB",
        "SCHEDULE",
        "NEXT TICK",
        "LAST RUN",
        "ON",
        "TOKEN",
        "OUTCOME",
        "DURATION",
        "FAILS",
        "LAST SUCCESS",
        "NOTE",
    ]);
    for job in &status.jobs {
        let run = job.last_run.as_ref();
        let mut notes = Vec::new();
        if !job.enabled {
            notes.push("disabled".to_string());
        }
        if let Some(read) = &job.paused {
            notes.push(format!("PAUSED {}", pause_note(read)));
        }
        if let Some(overdue) = &job.overdue {
            notes.push(format!("OVERDUE: no entry for {}", instant(overdue.tick)));
        }
        for request in &job.pending_triggers {
            notes.push(format!(
                "TRIGGERED at {} by {} (waiting for a worker until {})",
                instant(request.requested_at),
                or_dash(request.by.clone()),
                instant(request.not_after)
            ));
        }
        jobs.row(vec![
            job.name.clone(),
            format!("{} {}", job.schedule, job.timezone),
            job.next_tick.map_or("-".to_string(), instant),
            run.map_or("-".to_string(), |r| instant_ms(r.tick)),
            run.map_or("-".to_string(), |r| r.worker.clone()),
            run.and_then(|r| r.token)
                .map_or("-".to_string(), |t| t.to_string()),
            match run {
                Some(_) if job.unfinished => "unfinished".to_string(),
                Some(run) => outcome(run),
                None => "-".to_string(),
            },
            run.and_then(|r| r.duration_ms)
                .map_or("-".to_string(), duration_ms),
            job.failures_in_a_row.to_string(),
            job.last_success
                .as_ref()
                .map_or("-".to_string(), |r| instant_ms(r.tick)),
            or_dash(notes.join(", ")),
        ]);
    }
    out.push_str(&jobs.render());
    out
}

/// History entries as a table, in the order given.
pub(super) fn entries(entries: &[Entry]) -> String {
    if entries.is_empty() {
        return "no entries\n".to_string();
    }
    let mut table = Table::new(&[
        "TICK", "JOB", "KIND", "WORKER", "TOKEN", "OUTCOME", "EXIT", "DURATION", "DETAIL",
    ]);
    for e in entries {
        table.row(cells(e, true));
    }
    table.render()
}

/// An entry's cells: tick, job, its kind (`with_kind`, the entries' table), worker, token, outcome (of a
/// run; else `-` beside the kind, or the kind itself), exit, duration, detail.
fn cells(e: &Entry, with_kind: bool) -> Vec<String> {
    let outcome_text = match (e.kind, with_kind) {
        (Kind::Run, _) => outcome(e),
        (Kind::Control, _) => e.action.clone().unwrap_or_else(|| "control".to_string()),
        (_, true) => "-".to_string(),
        (kind, false) => kind.as_str().to_string(),
    };
    let mut cells = vec![instant_ms(e.tick), e.job.clone()];
    if with_kind {
        cells.push(e.kind.as_str().to_string());
    }
    cells.extend([
        e.worker.clone(),
        e.token.map_or("-".to_string(), |t| t.to_string()),
        outcome_text,
        exit(e),
        e.duration_ms.map_or("-".to_string(), duration_ms),
        or_dash(detail(e)),
    ]);
    cells
}

/// The history: one line per tick, in the order given — when, who ran it (token, outcome, exit, duration)
/// or why nobody did, and a count of the notes beside it; a double run first and loud. Each pause and
/// resume is a line of its own among them, at the time it was made (OUTCOME `paused`/`resumed`, DETAIL
/// its reason, who and until when).
pub(super) fn ticks(history: &History) -> String {
    let mut out = String::new();
    if history.ticks.is_empty() && history.controls.is_empty() {
        out.push_str("no entries\n");
    } else {
        let mut table = Table::new(&[
            "TICK", "JOB", "WORKER", "TOKEN", "OUTCOME", "EXIT", "DURATION", "DETAIL", "NOTES",
        ]);
        let mut controls = history.controls.iter().peekable();
        for record in &history.ticks {
            while let Some(control) = controls.next_if(|c| c.tick >= record.record.tick) {
                table.row(control_row(control));
            }
            let mut row = cells(&record.record, false);
            row.push(or_dash(notes(record)));
            table.row(row);
        }
        for control in controls {
            table.row(control_row(control));
        }
        out.push_str(&table.render());
    }
    if let Some(cut) = &history.cut_short {
        out.push_str(&format!("note: {}\n", visible(cut)));
    }
    out
}

/// A pause's or resume's line in the history: its cells, no notes.
fn control_row(control: &Entry) -> Vec<String> {
    let mut row = cells(control, false);
    row.push("-".to_string());
    row
}

/// The notes of a tick in a few words: `DOUBLE RUN` with the other runs first, then the other entries
/// counted by kind and reason (`2 lost: already_claimed`), in the order first seen.
fn notes(record: &TickRecord) -> String {
    let mut parts: Vec<String> = record
        .other_runs
        .iter()
        .map(|run| {
            format!(
                "DOUBLE RUN: also run by {} (token {}, {})",
                run.worker,
                run.token.map_or("-".to_string(), |t| t.to_string()),
                outcome(run)
            )
        })
        .collect();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for note in record.shown_notes() {
        let key = match &note.reason {
            Some(reason) => format!("{}: {reason}", note.kind.as_str()),
            None => note.kind.as_str().to_string(),
        };
        match counts.iter_mut().find(|(seen, _)| *seen == key) {
            Some((_, count)) => *count += 1,
            None => counts.push((key, 1)),
        }
    }
    parts.extend(
        counts
            .into_iter()
            .map(|(key, count)| format!("{count} {key}")),
    );
    parts.join(", ")
}

/// An entry's detail: its series first (a trigger's, a retry's), then its run id, or why and by whom.
fn detail(e: &Entry) -> String {
    let detail = match e.kind {
        Kind::Run => e.run_id.clone().unwrap_or_default(),
        Kind::Control => {
            let by = e.by.as_ref().map(|by| format!("by {by}"));
            let until = e.until.map(|t| format!("until {}", instant(t)));
            let parts: Vec<String> = e.reason.iter().cloned().chain(by).chain(until).collect();
            parts.join(" ")
        }
        _ => {
            let by = e.by.as_ref().map(|by| format!("by {by}"));
            let parts: Vec<String> = e.reason.iter().cloned().chain(by).collect();
            parts.join(" ")
        }
    };
    match e.series().tag() {
        Some(tag) => format!("{tag} {detail}").trim_end().to_string(),
        None => detail,
    }
}

/// How a run's child ended: its exit code, or the signal that ended it.
fn exit(e: &Entry) -> String {
    match (e.exit_code, e.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "-".to_string(),
    }
}

/// `explain`: the story, a hint, then the entries.
pub(super) fn explanation(explanation: &Explanation) -> String {
    let mut out = String::new();
    for line in &explanation.story {
        out.push_str(&visible(line));
        out.push('\n');
    }
    if let Some(hint) = &explanation.hint {
        out.push_str(&format!("hint: {}\n", visible(hint)));
    }
    for run in &explanation.runs {
        for (stream, tail) in [("stdout", &run.tail_out), ("stderr", &run.tail_err)] {
            if let Some(text) = tail {
                out.push_str(&output_tail(run, stream, text));
            }
        }
    }
    if !explanation.entries.is_empty() {
        out.push('\n');
        out.push_str(&entries(&explanation.entries));
    }
    out
}

/// The most lines of a run's kept output that `explain` prints, per stream.
const TAIL_LINES: usize = 20;

/// The end of a run's output on `stream`, as its worker kept it: a heading, then its last
/// [`TAIL_LINES`] lines, indented.
fn output_tail(run: &Entry, stream: &str, text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let shown = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    let mut out = format!(
        "{}'s run{}, {stream}, last {} line{}:\n",
        visible(&run.worker),
        run.token.map_or(String::new(), |t| format!(" (token {t})")),
        shown.len(),
        super::plural(shown.len())
    );
    for line in shown {
        out.push_str(&format!("    {}\n", visible(line)));
    }
    out
}

/// A run's outcome, or `running` while it has none.
fn outcome(run: &Entry) -> String {
    match (&run.outcome, run.ended_at) {
        (Some(outcome), _) => outcome.clone(),
        (None, None) => "running".to_string(),
        (None, Some(_)) => "?".to_string(),
    }
}

/// How long before `now` `then` was: `4s ago` (on this host's clock; `0s ago` if `then` is ahead of it).
fn ago(now: DateTime<Utc>, then: DateTime<Utc>) -> String {
    let secs = (now - then).num_seconds().max(0).unsigned_abs();
    format!(
        "{} ago",
        humantime::format_duration(std::time::Duration::from_secs(secs))
    )
}

fn or_dash(text: String) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        text
    }
}

/// An aligned plain-text table.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&str]) -> Table {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Adds a row; each cell is escaped whole ([`visible`]), so that it stays one cell of one line.
    fn row(&mut self, cells: Vec<String>) {
        let cells = cells.into_iter().map(|cell| visible(&cell).into_owned());
        self.rows.push(cells.collect());
    }

    /// Every column as wide as its widest cell, two spaces apart, no trailing spaces.
    fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 2));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests;
