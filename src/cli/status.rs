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
    let read = Reader::open(&config)
        .and_then(|reader| reader.gather(status::read(reader.store(), &config)));
    let inputs = match read {
        Ok(inputs) => inputs,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let status = status::status(&config, inputs, Utc::now());
    render::deliver(&status, &status.notes, args.json, render::status)
}
