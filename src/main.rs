//! The `redcron` binary: parse the arguments, hand them to [`redcron::cli::run`], exit with its code.
//!
//! Everything else (config, logging, signals, the runtime) is set up by the library, so that this file
//! stays a few lines and the tests can drive the same code.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    // Usage errors exit with 2 inside `parse`, as documented in `--help`.
    let args = redcron::cli::Args::parse();
    match redcron::cli::run(args) {
        Ok(code) => code,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "error: {error:#}");
            ExitCode::from(redcron::cli::Exit::Failure)
        }
    }
}
