//! The sentences of `explain`: one per history entry, the reasons workers record told for a person, and
//! what may explain a run that will never end or a tick with no entry.
//!
//! Apart from [`super::explain`], which decides the verdict, so that the wording can change without the
//! reasoning, and the reasoning can be read without the wording. `redcron trigger` tells its run with the
//! same sentences.

use super::explain::Facts;
use super::time::{duration_ms, instant};
use crate::config::show_duration;
use crate::history::{Entry, Kind};
use crate::lock::PauseRead;
use crate::membership::Member;

/// Why the run of `worker`, which is not alive, will never end in the history.
pub(crate) fn gone(members: &[Member], worker: &str) -> String {
    match members
        .iter()
        .find(|m| m.id == worker)
        .and_then(|m| m.seen_at)
    {
        Some(seen) => format!(
            "{worker} is no longer alive (last seen {}): the run's end will not be recorded",
            instant(seen)
        ),
        None => format!("{worker} is unknown to the store: the run's end will not be recorded"),
    }
}

/// A pause as `status` notes it: `until <instant> by <who>: <reason> (on <n> nodes)`, each part only
/// when there is one (no end: until `redcron resume`).
pub(crate) fn pause_note(read: &PauseRead) -> String {
    let until = read
        .pause
        .until
        .map_or(String::new(), |t| format!(" until {}", instant(t)));
    let reason = match read.pause.reason.as_str() {
        "" => String::new(),
        reason => format!(": {reason}"),
    };
    format!(
        "{until} by {}{reason} (on {} node{})",
        read.pause.by,
        read.nodes,
        if read.nodes == 1 { "" } else { "s" }
    )
    .trim_start()
    .to_string()
}

/// One entry as a sentence.
pub(crate) fn describe(entry: &Entry) -> String {
    let worker = &entry.worker;
    match entry.kind {
        Kind::Run => {
            let mut text = format!("{worker} won it");
            if let Some(tag) = entry.series().tag() {
                text.push_str(&format!(" ({tag})"));
            }
            if let Some(token) = entry.token {
                text.push_str(&format!(" with token {token}"));
            }
            if let Some(run_id) = &entry.run_id {
                text.push_str(&format!(" (run {run_id})"));
            }
            if let Some(started) = entry.started_at {
                text.push_str(&format!(", started {}", instant(started)));
            }
            match (entry.ended_at, entry.outcome.as_deref()) {
                (Some(ended), outcome) => {
                    text.push_str(&format!(", ended {}", instant(ended)));
                    text.push_str(&format!(": {}", outcome.unwrap_or("unknown outcome")));
                }
                (None, _) => text.push_str(", no end recorded yet"),
            }
            if let Some(code) = entry.exit_code {
                text.push_str(&format!(", exit code {code}"));
            }
            if let Some(signal) = entry.signal {
                text.push_str(&format!(", killed by signal {signal}"));
            }
            if let Some(ms) = entry.duration_ms {
                text.push_str(&format!(", after {}", duration_ms(ms)));
            }
            if let Some(reason) = &entry.reason {
                text.push_str(&format!(" ({reason})"));
            }
            text
        }
        Kind::Lost => {
            let mut text = format!("{worker} lost it");
            match &entry.by {
                // `by` claimed a later tick, not this one.
                Some(by) if entry.reason.as_deref() == Some("later_tick_claimed") => {
                    text.push_str(&format!(" (a later tick went to {by})"))
                }
                Some(by) => text.push_str(&format!(" to {by}")),
                None => {}
            }
            if let Some(reason) = &entry.reason {
                text.push_str(&format!(": {}", why(reason)));
            }
            text
        }
        Kind::Skipped => format!(
            "{worker} skipped it: {}{}",
            why(entry.reason.as_deref().unwrap_or("no reason given")),
            entry
                .by
                .as_ref()
                .map_or(String::new(), |by| match entry.reason.as_deref() {
                    Some("paused") => format!(", paused by {by}"),
                    _ => format!(", held by {by}"),
                })
        ),
        Kind::Missed => format!(
            "{worker} raised the alarm: missed, nobody ran it within its window{}{}",
            entry
                .reason
                .as_ref()
                .map_or(String::new(), |reason| format!(" ({})", why(reason))),
            entry
                .by
                .as_ref()
                .map_or(String::new(), |by| format!(", claimed by {by}"))
        ),
        Kind::Control => format!(
            "{} {} the job{}{}",
            entry.by.as_deref().unwrap_or(worker),
            entry.action.as_deref().unwrap_or("controlled"),
            entry
                .until
                .map_or(String::new(), |until| format!(" until {}", instant(until))),
            entry
                .reason
                .as_ref()
                .map_or(String::new(), |reason| format!(": {reason}"))
        ),
        Kind::Unknown => format!("{worker} wrote an entry of a kind this version does not know"),
    }
}

/// A reason of the history entries, for a person.
fn why(reason: &str) -> String {
    let text = match reason {
        "already_claimed" => "another worker had claimed it",
        "later_tick_claimed" => {
            "a later tick had been claimed first, so this one could no longer be"
        }
        "overlap" => "the job's previous run still held it (overlap: skip)",
        "superseded" => "a later tick was already due (overlap: skip)",
        "misfire" => "it was past its misfire grace when the worker got to it",
        "no_quorum" => "no majority of the nodes answered within its window",
        "contended" => "another worker held its lease without claiming it until its window ended",
        "lease_expired" => "the lease expired before the job could start (a paused process)",
        "no_slot" => {
            "the worker already ran its most children at once until the tick's window ended"
        }
        "shutdown" => "the worker was shutting down",
        "paused" => "the job was paused (redcron pause)",
        "unclaimed" => "nobody claimed it within its window",
        "no_run_recorded" => {
            "it was claimed, but no run was recorded: the winner died before starting it"
        }
        other => return other.to_string(),
    };
    format!("{reason}: {text}")
}

/// Why a tick whose window ended may have no entry at all.
pub(crate) fn no_entry_hint(facts: &Facts<'_>) -> String {
    if facts.earlier {
        format!(
            "no worker recorded it: none was alive, or every one was down, paused or cut off from a \
             majority of the nodes until its window ended (misfire_grace {}); a worker that comes back \
             reports such ticks as missed only within history.missed_lookback ({})",
            show_duration(facts.job.misfire_grace),
            show_duration(facts.history.missed_lookback)
        )
    } else {
        format!(
            "the store holds nothing of {} before this tick: the tick predates the job's first recorded \
             tick, or the store already dropped it (it keeps the newest {} ticks of each job, \
             history.keep_ticks)",
            facts.job.name, facts.history.keep_ticks
        )
    }
}
