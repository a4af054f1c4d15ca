//! The benchmark's job: one `O_APPEND` write of one line, `$REDCRON_JOB $REDCRON_TICK $REDCRON_WORKER_ID
//! <wall-clock ns>`, to the ledger named by its argument, first thing when it runs — which is how a job
//! records when it started.
//!
//! The benchmark compiles this file alone (`rustc -O`, std only, linked statically) and runs that program
//! as the workers' job (`main.rs`). It used to exec the benchmark binary itself with `--probe`: a ~190 MB
//! position-independent executable whose start (the dynamic loader's relocations and page faults) cost
//! ~2 ms of CPU, so 1,000 runs a second took more than this 2-core machine before any worker or node ran.
//! The small static program starts for what `/bin/true` does (~0.6 ms), so the figures are the
//! scheduler's, not the probe's loading. `lease --probe <ledger>` still runs this code, the fallback
//! when `rustc` cannot build it.

use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;

/// Appends this run's line to `ledger` in one `O_APPEND` write, so that concurrent runs never interleave
/// their lines; exit code 2 without a ledger, 1 when the write fails.
pub fn record(ledger: Option<OsString>) -> ExitCode {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let Some(ledger) = ledger else {
        return ExitCode::from(2);
    };
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let line = format!(
        "{} {} {} {now}\n",
        var("REDCRON_JOB"),
        var("REDCRON_TICK"),
        var("REDCRON_WORKER_ID")
    );
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger);
    match file.and_then(|mut f| f.write_all(line.as_bytes())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// The entry point when this file is compiled alone: `probe <ledger>`.
#[allow(dead_code)] // in the benchmark binary, `main.rs` calls `record` for `--probe`
fn main() -> ExitCode {
    record(std::env::args_os().nth(1))
}
