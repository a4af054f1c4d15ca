//! Alert hooks: a job's `on_failure` command when its runs start failing, `on_recovery` when they recover —
//! once per change, not once per failing run.
//!
//! The worker that ran a tick decides, after the run ended: it reads the job's earlier runs from the
//! history (a majority) and compares the latest one before this tick with this one. A failure after a
//! success (or after no run at all) is the *first failure*; a success after a failure is the *recovery*;
//! anything else alerts nobody. Since each tick runs on one worker, each change is alerted by one worker,
//! wherever the runs happened. With `retries`, only a tick's final attempt is a run here: a failure that
//! is retried alerts nobody ([`super::retry`]). Runs stopped by a shutdown count for neither. The hook runs with the job's
//! environment rules (`inherit_env`, `env`, never the store's variables) plus the run's fields, off the
//! run's path, for at most [`HOOK_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, info_span, warn, Instrument};

use super::env::job_environment;
use super::Context;
use crate::config::{Command, JobConfig};
use crate::history::{Entry, Kind, Query};
use crate::process::{ChildSpec, ExitKind, RunningChild};
use crate::schedule::Tick;

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

/// Decides, in the background, whether the run `ended` (its final history entry) is a change, and runs
/// the job's hook for it.
pub(crate) fn after_run(context: Arc<Context>, job: JobConfig, ended: Entry) {
    let Some(outcome) = ended.outcome.clone() else {
        return;
    };
    if !job.alerts.any() || outcome == "shutdown" {
        return;
    }
    let span = info_span!("alert", job = %job.name, tick = %ended.tick(), run_id = ended.run_id.as_deref().unwrap_or(""));
    tokio::spawn(
        async move {
            let earlier = earlier_runs(&context, &job, ended.tick()).await;
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

/// The outcomes of the job's runs before `tick`, newest first (one per tick; shutdowns left out), or
/// `None` if the history could not be read (then a failure alerts, a success does not).
///
/// The previous run may have ended a moment ago on another worker, whose final entry is still on its
/// way: while the newest earlier run has no outcome yet, the history is read again (up to
/// [`SETTLE_READS`] times, a second apart).
async fn earlier_runs(context: &Context, job: &JobConfig, tick: Tick) -> Option<Vec<String>> {
    let query = Query {
        job: job.name.clone(),
        since: None,
        until: Some(Tick(tick.as_millis() - 1)),
        limit: LOOK_BACK,
    };
    for read in 1..=SETTLE_READS {
        let entries = match context.store.history(&query).await {
            Ok(found) => found.value,
            Err(failure) => {
                warn!(event = "alert.history_unavailable", error = %failure,
                      "Could not read the job's earlier runs: a failure alerts as a first failure, a success alerts nobody");
                return None;
            }
        };
        // One run per tick: merged entries are newest first, a tick's run entry is one per worker, and of a
        // tick's attempts (retries, on one worker) the last comes first: its outcome is the tick's.
        let mut seen = std::collections::BTreeSet::new();
        let runs: Vec<Option<String>> = entries
            .into_iter()
            .filter(|e| e.kind == Kind::Run && seen.insert(e.tick))
            .map(|e| e.outcome)
            .filter(|outcome| outcome.as_deref() != Some("shutdown"))
            .collect();
        if matches!(runs.first(), Some(None)) && read < SETTLE_READS {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        return Some(runs.into_iter().flatten().collect());
    }
    None
}

/// How often the earlier runs are read while the newest of them has not ended.
const SETTLE_READS: u32 = 5;

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
            &context.store_env_vars,
            &job.env,
            &vars,
        ),
        workdir: job.workdir.clone(),
    };
    let mut child = match RunningChild::spawn(&spec) {
        Ok(child) => child,
        Err(err) => {
            warn!(event = "alert.failed", alert = fields.kind, error = %err, "Could not start the alert hook");
            return;
        }
    };
    let exit = match tokio::time::timeout(HOOK_TIMEOUT, child.wait()).await {
        Ok(exit) => exit,
        Err(_) => {
            child.kill_now();
            warn!(
                event = "alert.failed",
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
                event = "alert.sent",
                alert = fields.kind,
                failures = fields.in_a_row as u64,
                "Alert hook ran"
            );
        }
        Ok(kind) => {
            warn!(event = "alert.failed", alert = fields.kind, exit = ?kind, "The alert hook failed");
        }
        Err(err) => {
            warn!(event = "alert.failed", alert = fields.kind, error = %err, "The alert hook failed");
        }
    }
}
