//! Alert hooks: a job's `on_failure` command when its runs start failing, `on_recovery` when they recover —
//! once per change, not once per failing run.
//!
//! Alerts are decided from **final outcomes** only. A run's outcome is final when no attempt follows it: a
//! success, or a failure with no retry left or none to come (`lease_lost`, a trigger's run). A failed
//! attempt that is tried again says so in its history entry (`retry_in_ms`, [`super::retry`]) and counts
//! for nothing — neither for its tick nor for the runs that end while its retry waits; a tick whose retry
//! never runs (its worker died or shut down first) has no final outcome. Runs stopped by a shutdown count
//! for nothing either.
//!
//! The worker that ran a final attempt decides, once it ended: it reads the job's runs from the history (a
//! majority) and compares its outcome with the *previous final outcome* — that of the run with the highest
//! fencing token below this one's, passing over runs whose outcome is not final. A failure after a success
//! (or after no final outcome at all) is the *first failure*; a success after a failure is the *recovery*;
//! anything else alerts nobody. Tokens, not ticks, order the runs, because a tick's retry may end after
//! later ticks ran (they ran while it waited its backoff): the change is in what the job did last. With
//! `overlap: skip` a job's tokens rise in the order its runs held it, one after another (docs/protocol.md,
//! G2), so when a run ends every run below its token has ended: the final outcomes form one sequence, and
//! each change in it is seen by one run only, the later one, whose worker alerts — however the runs and
//! their attempts spread over workers. A tick whose retry waits is passed over rather than waited for: a
//! retry may wait minutes, an alert should not, and when the retry ends it takes its own place in the
//! sequence. (With `overlap: allow` runs may overlap: one still under way when a later one ends is left out
//! of that one's comparison once [`SETTLE_READS`] found it unended, so overlapping failures can alert
//! twice.) The history is read a second after the run ended, so that the entries of the run before it,
//! which may have ended a moment before on another worker, have landed; a history write delayed longer
//! (nodes out of reach) can cost an alert or double one.
//!
//! The hook runs with the job's environment rules (`inherit_env`, `env`, never the store's variables) plus
//! the run's fields, off the run's path, for at most [`HOOK_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, info_span, warn, Instrument};

use super::env::job_environment;
use super::Context;
use crate::config::{Command, JobConfig};
use crate::history::{Entry, Kind, Query};
use crate::logging::events;
use crate::process::{ChildSpec, ExitKind, RunningChild};

/// The longest a hook may run; it is killed after.
pub(crate) const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// How far back the earlier runs are read (entries, newest first).
const LOOK_BACK: usize = 500;

/// Which change a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    FirstFailure,
    Recovery,
}

/// Whether a run's outcome is a failure of the job (a shutdown is not).
fn failed(outcome: &str) -> bool {
    outcome != "success"
}

/// The entry's outcome if it is a final one: the end of a run, not stopped by a shutdown, that no attempt
/// follows.
fn final_outcome(entry: &Entry) -> Option<&str> {
    let outcome = entry.outcome.as_deref()?;
    let counts = entry.kind == Kind::Run && outcome != "shutdown" && entry.retry_in_ms.is_none();
    counts.then_some(outcome)
}

/// Whether `entry` is about a run before `ended`'s: a lower fencing token (an earlier tick, where either
/// has no token).
fn before(entry: &Entry, ended: &Entry) -> bool {
    match (entry.token, ended.token) {
        (Some(earlier), Some(this)) => earlier < this,
        _ => entry.tick < ended.tick,
    }
}

/// Decides, in the background, whether the run `ended` (its final history entry) is a change, and runs
/// the job's hook for it. Nothing for an outcome that is not final (see the module's doc).
pub(crate) fn after_run(context: Arc<Context>, job: Arc<JobConfig>, ended: Entry) {
    let Some(outcome) = final_outcome(&ended).map(str::to_string) else {
        return;
    };
    if !job.alerts.any() {
        return;
    }
    let span = info_span!("alert", job = %job.name, tick = %ended.tick(), run_id = ended.run_id.as_deref().unwrap_or(""));
    tokio::spawn(
        async move {
            let earlier = earlier_outcomes(&context, &job, &ended).await;
            let previous = earlier.as_ref().and_then(|runs| runs.first().cloned());
            let change = match (failed(&outcome), previous.as_deref().map(failed)) {
                (true, Some(false) | None) => Some(Change::FirstFailure),
                (false, Some(true)) => Some(Change::Recovery),
                _ => None,
            };
            let in_a_row = if failed(&outcome) {
                1 + earlier
                    .as_ref()
                    .map_or(0, |runs| runs.iter().take_while(|o| failed(o)).count())
            } else {
                0
            };
            let (hook, kind) = match change {
                Some(Change::FirstFailure) => (&job.alerts.on_failure, "failure"),
                Some(Change::Recovery) => (&job.alerts.on_recovery, "recovery"),
                None => return,
            };
            let Some(hook) = hook.clone() else { return };
            let fields = Fields {
                kind,
                previous: previous.as_deref().unwrap_or(""),
                in_a_row,
            };
            run_hook(&context, &job, &ended, hook, fields).await;
        }
        .instrument(span),
    );
}

/// The final outcomes of the job's runs before `ended` (by fencing token), newest first, or `None` if the
/// history could not be read (then a failure alerts, a success does not).
///
/// The run before may have ended a moment ago on another worker, whose entries are still on their way
/// (its recorder writes them a moment after the run's end, and this run may have been as short): the
/// history is first read [`SETTLE`] after this run's end, and again, [`SETTLE`] apart, while the newest
/// earlier run has no outcome yet (up to [`SETTLE_READS`] reads); after that, a run still without one is
/// left out.
async fn earlier_outcomes(
    context: &Context,
    job: &JobConfig,
    ended: &Entry,
) -> Option<Vec<String>> {
    // Every tick: a run before this one (a lower token) may be of a later tick, when this one is a retry.
    let query = Query {
        job: job.name.clone(),
        since: None,
        until: None,
        limit: LOOK_BACK,
    };
    for read in 1..=SETTLE_READS {
        tokio::time::sleep(SETTLE).await;
        let entries = match context.store.history(&query).await {
            Ok(found) => found.value,
            Err(failure) => {
                warn!(event = events::alert::HISTORY_UNAVAILABLE, error = %failure,
                      "Could not read the job's earlier runs: a failure alerts as a first failure, a success alerts nobody");
                return None;
            }
        };
        let mut runs: Vec<Entry> = entries
            .into_iter()
            .filter(|e| e.kind == Kind::Run && before(e, ended))
            .collect();
        runs.sort_by_key(|run| std::cmp::Reverse((run.token, run.tick)));
        if runs.first().is_some_and(|run| run.outcome.is_none()) && read < SETTLE_READS {
            continue;
        }
        return Some(
            runs.iter()
                .filter_map(final_outcome)
                .map(str::to_string)
                .collect(),
        );
    }
    None
}

/// How often the earlier runs are read while the newest of them has not ended.
const SETTLE_READS: u32 = 5;

/// The wait before each read of the earlier runs: the entries of a run are written 20 ms after it ended
/// (the recorder's batching), so a second leaves room for a loaded host.
const SETTLE: Duration = Duration::from_secs(1);

/// What a hook is told besides the run's own fields.
struct Fields<'a> {
    kind: &'static str,
    previous: &'a str,
    in_a_row: usize,
}

/// Runs `hook` for `ended` and logs how it went.
async fn run_hook(
    context: &Context,
    job: &JobConfig,
    ended: &Entry,
    hook: Command,
    fields: Fields<'_>,
) {
    let mut vars = vec![
        ("REDCRON_ALERT", fields.kind.to_string()),
        ("REDCRON_JOB", job.name.clone()),
        ("REDCRON_TICK", ended.tick().to_string()),
        ("REDCRON_RUN_ID", ended.run_id.clone().unwrap_or_default()),
        (
            "REDCRON_FENCING_TOKEN",
            ended.token.map_or(String::new(), |t| t.to_string()),
        ),
        ("REDCRON_WORKER_ID", context.worker_id.clone()),
        ("REDCRON_OUTCOME", ended.outcome.clone().unwrap_or_default()),
        ("REDCRON_PREVIOUS_OUTCOME", fields.previous.to_string()),
        ("REDCRON_FAILURES", fields.in_a_row.to_string()),
        (
            "REDCRON_DURATION_MS",
            ended.duration_ms.map_or(String::new(), |d| d.to_string()),
        ),
    ];
    if let Some(code) = ended.exit_code {
        vars.push(("REDCRON_EXIT_CODE", code.to_string()));
    }
    if let Some(signal) = ended.signal {
        vars.push(("REDCRON_SIGNAL", signal.to_string()));
    }
    let vars: Vec<(String, String)> = vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let spec = ChildSpec {
        command: hook,
        env: job_environment(
            &context.worker_env,
            &job.inherit_env,
            &context.secret_env_vars,
            &job.env,
            &vars,
        ),
        workdir: job.workdir.clone(),
        stop_grace: job.stop_grace,
    };
    let mut child = match RunningChild::spawn(&spec) {
        Ok(child) => child,
        Err(err) => {
            warn!(event = events::alert::FAILED, alert = fields.kind, error = %err, "Could not start the alert hook");
            return;
        }
    };
    let exit = match tokio::time::timeout(HOOK_TIMEOUT, child.wait()).await {
        Ok(exit) => exit,
        Err(_) => {
            child.kill_now();
            warn!(
                event = events::alert::FAILED,
                alert = fields.kind,
                error = "timed out",
                timeout_ms = HOOK_TIMEOUT.as_millis() as u64,
                "The alert hook ran too long and was killed"
            );
            return;
        }
    };
    match exit {
        Ok(ExitKind::Code(0)) => {
            info!(
                event = events::alert::SENT,
                alert = fields.kind,
                failures = fields.in_a_row as u64,
                "Alert hook ran"
            );
        }
        Ok(kind) => {
            warn!(event = events::alert::FAILED, alert = fields.kind, exit = ?kind, "The alert hook failed");
        }
        Err(err) => {
            warn!(event = events::alert::FAILED, alert = fields.kind, error = %err, "The alert hook failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry of a run of `tick` with `token` that ended with `outcome` (`None`: under way).
    fn run(tick: i64, token: u64, outcome: Option<&str>) -> Entry {
        let now = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
        let mut entry = Entry::new("j", crate::schedule::Tick(tick), "w1", Kind::Run, now);
        entry.token = Some(token);
        entry.outcome = outcome.map(str::to_string);
        entry
    }

    /// A success or a failure no attempt follows is final; a retried failure, a run under way, a run
    /// stopped by a shutdown and any entry that is no run are not.
    #[test]
    fn only_ended_runs_that_no_attempt_follows_are_final() {
        assert_eq!(final_outcome(&run(1, 1, Some("success"))), Some("success"));
        assert_eq!(
            final_outcome(&run(1, 1, Some("lease_lost"))),
            Some("lease_lost")
        );
        assert_eq!(final_outcome(&run(1, 1, None)), None, "still running");
        assert_eq!(final_outcome(&run(1, 1, Some("shutdown"))), None);
        let mut retried = run(1, 1, Some("failure"));
        retried.retry_in_ms = Some(10_000);
        assert_eq!(final_outcome(&retried), None, "a retry follows");
        let mut skipped = run(1, 1, Some("success"));
        skipped.kind = Kind::Skipped;
        assert_eq!(final_outcome(&skipped), None);
    }

    /// The run before a retry is the one of the token below it, even of a later tick; without tokens,
    /// ticks order.
    #[test]
    fn runs_are_ordered_by_token_not_tick() {
        // The retry of tick 1000 ran after tick 2000: tick 2000's run is before it.
        let retry = run(1000, 2_000_001, Some("success"));
        let later_tick = run(2000, 2_000_000, Some("failure"));
        assert!(before(&later_tick, &retry));
        assert!(!before(&retry, &later_tick));
        let mut no_token = run(2000, 0, None);
        no_token.token = None;
        assert!(!before(&no_token, &retry), "by tick without a token");
    }
}
