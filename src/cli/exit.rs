//! How `redcron` exits: each of its own exit codes with its meaning, from which `--help` lists them, and
//! the job's own exit code that `trigger --wait` passes on.
//!
//! One type, so that a code is never written as a bare number and its meaning is written once: `--help`
//! is generated from [`Exit::DOCUMENTED`], and a test holds `docs/cli.md`'s exit-code table to it.

use std::process::ExitCode;

/// How a command ends. Every variant but [`Exit::Job`] is one of redcron's own codes, stable across
/// releases because scripts test them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The worker stopped gracefully, or the command succeeded.
    Ok,
    /// A failure at run time (the worker could not start or stopped on an error).
    Failure,
    /// The configuration or the command line is wrong; nothing was run (also `pause` whose `--for` had run
    /// out before the pause reached the store: nothing was written).
    Usage,
    /// The store could not be reached: fewer than a majority of its nodes answered (`status`, `history`,
    /// `explain`), or took the change (`pause`, `resume`, `trigger`).
    NoMajority,
    /// `trigger`: no run came of the request within its `--timeout` (no live worker runs the job, the job
    /// is paused, another run held it the whole time), or, with `--wait`, the run's worker died before
    /// recording its end.
    NoRun,
    /// `pause` and `trigger`: a live worker would ignore the command (one of an earlier release, which does
    /// not list it in its announcement's `honours`); nothing was written. `--even-if-ignored` acts anyway.
    Ignored,
    /// A second SIGINT/SIGTERM stopped the worker (and its jobs) at once.
    Stopped,
    /// `trigger --wait`: the job's own exit code (128+N if signal N ended it), which may equal one of
    /// redcron's (`--json` tells them apart).
    Job(u8),
}

impl Exit {
    /// Every exit code in the order `--help` and `docs/cli.md` list them; `Job(0)` stands for any job's code.
    pub(crate) const DOCUMENTED: [Exit; 8] = [
        Exit::Ok,
        Exit::Failure,
        Exit::Usage,
        Exit::NoMajority,
        Exit::NoRun,
        Exit::Ignored,
        Exit::Job(0),
        Exit::Stopped,
    ];

    /// The process's exit code.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::NoMajority => 3,
            Exit::NoRun => 4,
            Exit::Ignored => 5,
            Exit::Stopped => 130,
            Exit::Job(code) => code,
        }
    }

    /// What lists the code in `--help` and `docs/cli.md`: the code itself, or for a job's code the command
    /// that passes it on.
    pub(crate) fn label(self) -> String {
        match self {
            Exit::Job(_) => "trigger --wait".to_string(),
            own => own.code().to_string(),
        }
    }

    /// What the code means, as `--help` words it: one line, broken where `--help` breaks it (`\n`).
    pub(crate) const fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "success; for `run`, stopped gracefully after SIGINT/SIGTERM",
            Exit::Failure => "runtime failure",
            Exit::Usage => {
                "bad configuration or usage (every problem is printed as file:line:column: field: message);\n\
                 pause: its --for ran out before the pause reached the store (nothing was written)"
            }
            Exit::NoMajority => {
                "the store could not be reached: no majority of its nodes answered (status, history, explain)\n\
                 or took the change (pause, resume: the job may then still run, or stay paused; trigger: the\n\
                 request may still run once)"
            }
            Exit::NoRun => {
                "trigger: no run came of the request within --timeout (no live worker runs the job, it is\n\
                 paused, or another run held it throughout), or with --wait its worker died during the run"
            }
            Exit::Ignored => {
                "pause, trigger: a live worker would ignore the command (an earlier release); nothing was\n\
                 written; the error names the worker; --even-if-ignored acts anyway"
            }
            Exit::Job(_) => {
                "exits with the job's exit code (128+N if signal N ended it, 1 if it could not start);\n\
                 use --json to tell it from redcron's own codes"
            }
            Exit::Stopped => "stopped at once by a second SIGINT/SIGTERM",
        }
    }

    /// The "Exit codes:" part of `--help`: each code, then its meaning, continued lines indented under it.
    pub(crate) fn help() -> String {
        let mut text = String::from("Exit codes:\n");
        for exit in Exit::DOCUMENTED {
            let mut lines = exit.meaning().lines();
            let first = lines.next().unwrap_or_default();
            text.push_str(&format!("  {:<4} {first}\n", exit.label()));
            for line in lines {
                text.push_str(&format!("       {line}\n"));
            }
        }
        text
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::Exit;

    /// `docs/cli.md`, the command line's reference, with the exit-code table.
    const CLI_DOC: &str = include_str!("../../docs/cli.md");

    /// `docs/cli.md`'s exit-code table as (code, meaning) rows, without the backticks around the code.
    fn readme_rows() -> BTreeSet<(String, String)> {
        let start = CLI_DOC
            .find("| exit code | meaning |")
            .expect("docs/cli.md has an exit-code table");
        CLI_DOC[start..]
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
                assert_eq!(cells.len(), 2, "an exit-code row has two cells: {line}");
                (
                    cells[0].trim().trim_matches('`').to_string(),
                    cells[1].trim().to_string(),
                )
            })
            .collect()
    }

    /// `docs/cli.md`'s exit-code table has a row for every code, with the meaning `--help` gives it, and no
    /// other row.
    #[test]
    fn the_readme_lists_every_code_and_no_other() {
        let readme = readme_rows();
        let code: BTreeSet<(String, String)> = Exit::DOCUMENTED
            .iter()
            .map(|exit| (exit.label(), exit.meaning().replace('\n', " ")))
            .collect();
        let missing: Vec<_> = code.difference(&readme).collect();
        let unknown: Vec<_> = readme.difference(&code).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "codes missing from docs/cli.md's exit-code table, or worded otherwise: {missing:?}; \
             rows of the table that are no code of Exit: {unknown:?}"
        );
    }

    /// Each of redcron's own codes is a different number, and a job's code passes through unchanged.
    #[test]
    fn own_codes_differ_and_a_jobs_code_is_kept() {
        let own: BTreeSet<u8> = Exit::DOCUMENTED
            .iter()
            .filter(|exit| !matches!(exit, Exit::Job(_)))
            .map(|exit| exit.code())
            .collect();
        assert_eq!(own.len(), Exit::DOCUMENTED.len() - 1);
        assert_eq!(Exit::Job(137).code(), 137);
    }
}
