//! Stage two for a job's retry policy: `retries`, `retry_backoff` and `retry_backoff_max`, and the wait
//! before each attempt.
//!
//! Attempt `k` (1, 2, …; the first run is attempt 0) waits `retry_backoff × 2^(k−1)` after the attempt
//! before it ended, capped at `retry_backoff_max`: 10 s, 20 s, 40 s … by default, never more than 10 min.

use std::time::Duration;

use super::raw::RawJob;
use super::validate::{positive_duration, retries};
use super::{Report, RetryPolicy};

/// The default `retry_backoff`.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(10);
/// The default `retry_backoff_max`.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(600);

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 0,
            backoff: DEFAULT_BACKOFF,
            backoff_max: DEFAULT_BACKOFF_MAX,
        }
    }
}

impl RetryPolicy {
    /// How long attempt `attempt` (1 or more) waits after the attempt before it ended.
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.backoff
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.backoff_max)
    }
}

/// The policy of the job `raw` at `path` (`jobs[i]`); what is invalid is reported and left at its default.
pub(super) fn policy(raw: &RawJob, path: &str, report: &mut Report) -> RetryPolicy {
    let field = |name: &str| format!("{path}.{name}");
    let defaults = RetryPolicy::default();
    let retries = retries(raw.retries.as_ref(), &field("retries"), report).unwrap_or(0);
    let backoff = positive_duration(raw.retry_backoff.as_ref(), &field("retry_backoff"), report)
        .unwrap_or(defaults.backoff);
    let max = raw.retry_backoff_max.as_ref();
    let backoff_max = positive_duration(max, &field("retry_backoff_max"), report)
        .unwrap_or(defaults.backoff_max.max(backoff));
    if let Some(value) = max.filter(|_| backoff_max < backoff) {
        let why = format!(
            "retry_backoff_max ({}) must be at least retry_backoff ({})",
            super::show_duration(backoff_max),
            super::show_duration(backoff)
        );
        report.error(value.mark, &field("retry_backoff_max"), why);
    }
    RetryPolicy {
        retries,
        backoff,
        backoff_max,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let policy = RetryPolicy {
            retries: 100,
            backoff: Duration::from_secs(10),
            backoff_max: Duration::from_secs(600),
        };
        let delays: Vec<u64> = (1..=8).map(|k| policy.delay(k).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 600, 600]);
        assert_eq!(policy.delay(100), Duration::from_secs(600));
    }

    /// `jobs.yaml` with one job `j` and its `fields` (indented as list-item fields): the config, or its
    /// problems as printed.
    pub(in crate::config) fn parse(fields: &str) -> Result<crate::config::Config, Vec<String>> {
        let yaml = format!(
            "jobs:\n  - name: j\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n{fields}"
        );
        crate::config::parse(&yaml, std::path::Path::new("jobs.yaml"))
            .map_err(|e| e.problems().iter().map(ToString::to_string).collect())
    }

    #[test]
    fn settings_are_read_and_checked_with_their_place() {
        let config = parse("    retries: 3\n    retry_backoff: 2s\n").expect("valid");
        let policy = config.jobs[0].retry;
        assert_eq!(
            (policy.retries, policy.backoff),
            (3, Duration::from_secs(2))
        );
        assert_eq!(policy.backoff_max, DEFAULT_BACKOFF_MAX);
        let defaults = parse("").expect("valid").jobs[0].retry;
        assert_eq!(defaults, RetryPolicy::default());
        let problems =
            parse("    retries: 101\n    retry_backoff: 0s\n    retry_backoff_max: 1s\n")
                .expect_err("three problems");
        assert!(
            problems[0].starts_with("jobs.yaml:5:14: jobs[0].retries: invalid retries \"101\""),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("jobs[0].retry_backoff: must be more than zero"),
            "{problems:?}"
        );
        let big =
            parse("    retry_backoff: 1m\n    retry_backoff_max: 30s\n").expect_err("max below");
        assert!(big[0].contains("jobs[0].retry_backoff_max: retry_backoff_max (30s) must be at least retry_backoff (1m)"), "{big:?}");
    }
}
