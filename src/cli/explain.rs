//! `redcron explain JOB TICK`: one tick's story across the cluster.
//!
//! Reads and tells it through the [`crate::inspect::explain`] model, then prints the story and the entries,
//! (with a failed run's kept output, its last lines indented), or its JSON. `TICK` is taken in every form
//! `history` and `status` print one: RFC 3339, milliseconds since the Unix epoch, or a run under way as
//! `status` shows it, `JOB@TICK#TOKEN` ([`crate::inspect::parse_tick`]).

use std::process::ExitCode;

use chrono::{DateTime, Utc};

use super::read::Reader;
use super::{load_job, render, ConfigArg};
use crate::inspect::{explain, parse_tick};
use crate::schedule::Tick;

/// Arguments of `explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The job's name.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// The tick: RFC 3339 (e.g. 2026-11-23T10:00:00Z, as `history` and `status` print it) or milliseconds
    /// since the Unix epoch (e.g. 1795436705000, as `--json` prints it); a run under way as `status`
    /// prints it (job@2026-11-23T10:00:00Z#token) is taken too.
    #[arg(value_name = "TICK", value_parser = parse_tick)]
    pub tick: DateTime<Utc>,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON (field names in docs/history.md) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Carries out `explain`.
pub(super) fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let (config, job) = match load_job(&args.config, &args.job) {
        Ok(found) => found,
        Err(code) => return Ok(code),
    };
    let tick = Tick(args.tick.timestamp_millis());
    let read = Reader::open(&config)
        .and_then(|reader| reader.gather(explain::read(reader.store(), &job.name, tick)));
    let inputs = match read {
        Ok(inputs) => inputs,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let explanation = explain::explain(&job, &config.history, tick, inputs, Utc::now());
    render::deliver(
        &explanation,
        &explanation.notes,
        args.json,
        render::explanation,
    )
}
