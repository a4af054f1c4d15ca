//! The inspect model: what `status`, `history` and `explain` know — the workers and the jobs as they stand,
//! the run history, one tick's story — computed once, as plain data, for the command line to print as text
//! or JSON, and for any other reader (a web page) to render the same way.
//!
//! Each view is a module in two halves:
//! - an async `read` that gathers what the view needs from a [`Store`](crate::store::Store) into plain
//!   inputs, with [`Notes`] of what could not be read; it fails only when no majority of the nodes answered;
//! - a pure function from those inputs (and the config, and `now`) to the view: a value whose JSON is the
//!   one `--json` prints (field names in docs/history.md). It does no I/O and reads no clock, so it is
//!   unit-tested on inputs made by hand.
//!
//! Times in the views are RFC 3339 in UTC, except the ticks that entries and runs under way hold in
//! milliseconds since the Unix epoch (as stored): each carries `tick_rfc3339` beside it ([`time`]).
//! [`parse_tick`] takes a tick in either form, as the views print it.
//!
//! - [`status`]: the workers the store knows and each job of the config, as they stand now.
//! - [`history`]: the ticks of several jobs merged, newest first, one record each
//!   ([`crate::history::tick`]).
//! - [`explain`]: one tick's story, with its verdict, who raced and why each loser lost.
//! - `story`: the sentences of that story (and of `trigger`'s report), apart from the reasoning.

pub mod explain;
pub mod history;
mod notes;
pub mod status;
pub(crate) mod story;
pub mod time;

pub use self::notes::{MissingNode, Notes};
pub use self::time::parse_tick;

/// What the views' unit tests share: a config of one job that fires every minute, and instants.
#[cfg(test)]
mod fixtures {
    use chrono::{DateTime, Utc};

    use crate::config::Config;

    /// A config of one job, `every-minute` (`* * * * *`, UTC, the default misfire grace of 30 s).
    pub(super) fn config() -> Config {
        let yaml = "jobs:\n  - name: every-minute\n    schedule: \"* * * * *\"\n    command: [\"/bin/true\"]\n";
        crate::config::parse(yaml, std::path::Path::new("jobs.yaml")).expect("a valid config")
    }

    /// `secs` seconds after the Unix epoch.
    pub(super) fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap_or_default()
    }
}
