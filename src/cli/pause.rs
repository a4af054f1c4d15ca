//! `redcron pause JOB [--for DURATION] [--reason TEXT]` and `redcron resume JOB`: stop and restart a job's
//! ticks through the lock.
//!
//! `pause` writes the job's pause to every node and succeeds once a majority took it; from then on both
//! rounds of every claim refuse, so no tick of the job is granted anywhere — also on a worker that has not
//! heard of the pause — and the workers record its ticks as skipped (`paused`), never as missed. Runs under
//! way go on. `--for` gives the pause a TTL on each node, so it ends by itself. `resume` deletes it on every
//! node. Both then read the pause back, so the report says on how many nodes it stands.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::read::{Notes, Reader};
use super::render::instant;
use super::{load_job, operator, render, ConfigArg};
use crate::lock::{Pause, PauseRead};

/// The longest `--for`: a pause meant to last longer is a pause until `resume`.
const MAX_FOR: Duration = Duration::from_secs(366 * 24 * 3600);

/// Arguments of `pause`.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// The job's name.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// End the pause by itself after this long (90s, 30m, 2h, 1day; at most a year). Default: until
    /// `redcron resume`.
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_for)]
    pub duration: Option<Duration>,
    /// Why, for `status` and the workers' `tick.skipped` events.
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub reason: String,
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
    /// `paused` or `resumed`.
    pub action: &'static str,
    /// For `resume`: whether a node held a pause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_paused: Option<bool>,
    /// The pause as read back after the write (`null` once resumed), with on how many nodes it stands.
    pub paused: Option<PauseRead>,
    /// How many nodes the store has.
    pub configured_nodes: usize,
    #[serde(flatten)]
    pub notes: Notes,
}

/// Carries out `pause`.
pub(super) fn pause(args: &PauseArgs) -> anyhow::Result<ExitCode> {
    let pause = Pause {
        until: args.duration.map(|duration| until(Utc::now(), duration)),
        by: operator(),
        reason: args.reason.clone(),
    };
    change(&args.config, &args.job, args.json, |reader, job| {
        reader.pause(job, &pause)?;
        Ok(None)
    })
}

/// Carries out `resume`.
pub(super) fn resume(args: &ResumeArgs) -> anyhow::Result<ExitCode> {
    change(&args.config, &args.job, args.json, |reader, job| {
        reader.resume(job).map(Some)
    })
}

/// Loads the config, finds the job, makes the change (`write`), reads the pause back and reports it.
fn change(
    config: &ConfigArg,
    name: &str,
    json: bool,
    write: impl FnOnce(&mut Reader, &str) -> Result<Option<bool>, super::read::ReadError>,
) -> anyhow::Result<ExitCode> {
    let (config, job) = match load_job(config, name) {
        Ok((config, job)) => (config, job.name),
        Err(code) => return Ok(code),
    };
    // An etcd pause is in the cluster's committed state, which every member applies.
    let configured_nodes = match (&config.redis, &config.etcd) {
        (Some(redis), _) => redis.nodes.len(),
        (None, Some(etcd)) => etcd.endpoints.len(),
        (None, None) => 1,
    };
    let done = Reader::open(&config).and_then(|mut reader| {
        let was_paused = write(&mut reader, &job)?;
        let paused = reader.pauses(std::slice::from_ref(&job))?.pop().flatten();
        Ok((was_paused, paused, reader.notes()))
    });
    let (was_paused, paused, notes) = match done {
        Ok(done) => done,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let report = PauseReport {
        action: if was_paused.is_some() {
            "resumed"
        } else {
            "paused"
        },
        job,
        was_paused,
        paused,
        configured_nodes,
        notes,
    };
    render::deliver(&report, &report.notes, json, text)
}

/// The report as a sentence or two.
fn text(report: &PauseReport) -> String {
    let nodes = |read: &PauseRead| format!("{} of {} nodes", read.nodes, report.configured_nodes);
    match (&report.paused, report.was_paused) {
        (Some(read), None) => {
            let until = read
                .pause
                .until
                .map_or("until `redcron resume`".to_string(), |t| {
                    format!("until {}", instant(t))
                });
            let reason = match read.pause.reason.as_str() {
                "" => String::new(),
                reason => format!(": {reason}"),
            };
            format!(
                "paused {} {until} (by {}, on {}){reason}\nno tick of it starts anywhere until then; runs under way go on\n",
                report.job,
                read.pause.by,
                nodes(read)
            )
        }
        (Some(read), Some(_)) => format!(
            "resumed {}, but a pause is still on {}: run `redcron resume {}` again\n",
            report.job,
            nodes(read),
            report.job
        ),
        (None, Some(true)) => format!("resumed {}: its next tick runs\n", report.job),
        (None, Some(false)) => format!("{} was not paused\n", report.job),
        // Written to a majority, then gone: it expired, or a `resume` came in between.
        (None, None) => format!(
            "paused {}, but the pause is gone already (it ended, or was resumed)\n",
            report.job
        ),
    }
}

/// When a pause of `duration` from `now` ends.
fn until(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(duration).unwrap_or_default()
}

/// `--for`: a duration above zero and at most a year.
fn parse_for(text: &str) -> Result<Duration, String> {
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
