//! `redcron history`: the run history — runs and ticks not run — one line per tick, newest first.
//!
//! Without `--job` every job of the config is read; the [`crate::inspect::history`] model folds each
//! tick's entries into its record and merges the jobs, so the newest `--limit` ticks of the whole config
//! come out in tick order, whichever jobs they belong to. Pauses and resumes (`control` entries) are lines
//! of their own among them, not counted by `--limit`.

use std::process::ExitCode;

use chrono::{DateTime, Utc};

use super::read::Reader;
use super::{find_job, load, parse_instant, render, ConfigArg};
use crate::inspect::history;

use crate::inspect::history::MAX_LIMIT;

/// Arguments of `history`.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Only this job's entries (default: every job of the config file).
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Only ticks at or after this instant: RFC 3339 (2026-11-23T10:00:00Z) or a duration back from now
    /// (90s, 30m, 1h, 2days).
    #[arg(long, value_name = "TIME", value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Print at most this many ticks, newest first (1 to 5000), each with all its entries in `--json`.
    /// Pauses and resumes made since the oldest tick printed are lines of their own beside them
    /// (`controls` in `--json`), not counted.
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=MAX_LIMIT as i64))]
    pub limit: u32,
    /// Print JSON (field names in docs/history.md) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Carries out `history`.
pub(super) fn run(args: &HistoryArgs) -> anyhow::Result<ExitCode> {
    let config = match load(&args.config.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    let jobs: Vec<String> = match &args.job {
        Some(name) => match find_job(&config, name) {
            Ok(job) => vec![job.name.clone()],
            Err(code) => return Ok(code),
        },
        None => config.jobs.iter().map(|job| job.name.clone()).collect(),
    };
    let limit = args.limit as usize;
    let read = Reader::open(&config)
        .and_then(|reader| reader.gather(history::read(reader.store(), &jobs, args.since, limit)));
    let history = match read {
        Ok(history) => history,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    if let Some(cut) = &history.cut_short {
        if args.json {
            super::say(&format!("warning: {cut}"));
        }
    }
    render::deliver(&history, &history.notes, args.json, render::ticks)
}

/// `--since`: an RFC 3339 instant, or a duration back from now.
fn parse_since(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(instant) = parse_instant(text) {
        return Ok(instant);
    }
    let ago = humantime::parse_duration(text.trim()).map_err(|_| {
        format!(
            "{text:?} is neither an RFC 3339 timestamp (2026-11-23T10:00:00Z) nor a duration back \
             from now (90s, 30m, 1h, 2days)"
        )
    })?;
    let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
    Utc::now()
        .checked_sub_signed(ago)
        .ok_or_else(|| format!("{text:?} reaches back before any date"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--since` reads an RFC 3339 instant or a duration back from now, and names both when neither.
    #[test]
    fn since_takes_an_instant_or_a_duration_back() {
        let instant = parse_since("2026-11-23T10:00:00+01:00").expect("RFC 3339");
        assert_eq!(instant.to_rfc3339(), "2026-11-23T09:00:00+00:00");
        let hour_ago = parse_since("1h").expect("a duration");
        let age = Utc::now() - hour_ago;
        assert!(age >= chrono::Duration::minutes(59) && age <= chrono::Duration::minutes(61));
        let error = parse_since("yesterday").expect_err("neither");
        assert!(error.contains("neither an RFC 3339 timestamp"), "{error}");
    }
}
