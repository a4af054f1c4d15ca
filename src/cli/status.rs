//! `redcron status`: the workers the store knows and the jobs of the config file, as they stand now.
//!
//! Reads and computes through the [`crate::inspect::status`] model, then prints its two tables or its JSON.

use std::process::ExitCode;

use chrono::Utc;

use super::read::Reader;
use super::{load, render, ConfigArg};
use crate::inspect::status;

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON (field names in docs/history.md) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Carries out `status`.
pub(super) fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let config = match load(&args.config.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    let jobs: Vec<_> = config.jobs.iter().collect();
    let read = Reader::open(&config).and_then(|reader| {
        reader.gather(status::read_status(
            reader.store(),
            &config,
            &jobs,
            status::ENTRIES_PER_JOB,
            Utc::now(),
        ))
    });
    let status = match read {
        Ok(status) => status,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    render::deliver(&status, &status.notes, args.json, render::status)
}
