//! `POST /api/jobs/pause` and `/api/jobs/resume`: pause or resume several jobs at once — a maintenance
//! window — as `redcron pause JOB… | --all` does, and the form under `/`'s table that does it for the
//! jobs listed there.
//!
//! The body names the jobs (`jobs`: a JSON array, or names separated by white space from a form) or asks
//! for `all` of the config in force, with a pause's `for` and `reason`. Every name must be a job of the
//! config (else 404 naming the unknown ones, nothing written). The request is let in by the same rules as
//! one job's control ([`super::api::admit`]: controls on, a token, the session's CSRF token with a
//! cookie), a pause is refused (409) while a live worker of an earlier release would ignore it, and each
//! job is then changed as one job's control changes it, one after the other, with one end for every
//! pause. No transaction spans jobs (no store has one across keys): a store failure stops at that job —
//! the jobs changed before it stand and are recorded, the answer (503) lists those not changed. So does
//! a request that has taken [`BULK_TIME`]: a slow store holds no request, and no store connection, for
//! much longer than that, however many jobs it names. Each job's change is logged (`dashboard.control`),
//! and the changes that took effect are recorded in the history as `control` entries, in one write.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Json};
use serde::Serialize;
use tracing::info;

use super::api::{self, admit, problem, Admitted, ControlBody, Problem};
use super::read::bounded;
use super::{Access, Dashboard};
use crate::config::JobConfig;
use crate::history::Control;
use crate::lock::{InForce, Pause, PauseOutcome};
use crate::logging::events;
use crate::membership::Capability;

/// How many unknown names an answer lists.
const UNKNOWN_SHOWN: usize = 10;

/// The longest a request of several jobs goes on starting changes (each change is bounded by
/// [`super::read::READ_TIMEOUT`] too): ten thousand jobs take seconds on a healthy store.
const BULK_TIME: Duration = Duration::from_secs(60);

/// What a control of several jobs answers in JSON.
#[derive(Debug, Serialize)]
struct BulkReport {
    action: &'static str,
    by: String,
    /// Each job changed, in order.
    jobs: Vec<Changed>,
    /// The jobs left as they were, in order, and why.
    not_changed: Vec<NotChanged>,
    /// Whether the `control` entries of the changes that took effect reached the history; absent when
    /// none was to be recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    recorded_in_history: Option<bool>,
    /// Why the store stopped the command, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// One job's change.
#[derive(Debug, Serialize)]
struct Changed {
    job: String,
    /// `paused`, `kept` (a longer pause in force stays), `resumed`, `was_not_paused`.
    result: &'static str,
    /// The pause in force after a pause (the longer one kept), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    paused: Option<Pause>,
}

/// A job left as it was, and why.
#[derive(Debug, Serialize)]
struct NotChanged {
    job: String,
    why: String,
}

/// `POST /api/jobs/{action}`: `pause` or `resume` of several jobs.
pub(super) async fn control(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    Path(action): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let action: &'static str = match action.as_str() {
        "pause" => "pause",
        "resume" => "resume",
        other => {
            let why = format!("no control {other:?} of several jobs: pause or resume");
            return problem(StatusCode::NOT_FOUND, &why);
        }
    };
    let Admitted { body, form, by } = match admit(&access, from, &headers, &body) {
        Ok(admitted) => admitted,
        Err(problem) => return problem.into_response(),
    };
    let jobs = match selected(&access, &body) {
        Ok(jobs) => jobs,
        Err(problem) => return problem.into_response(),
    };
    let change = Change {
        dashboard: &dashboard,
        access: &access,
        from,
        by,
        reason: body.reason(),
    };
    let report = match action {
        "pause" => {
            let until = match body.until() {
                Ok(until) => until,
                Err(why) => return problem(StatusCode::BAD_REQUEST, &why),
            };
            match api::ignored(&dashboard, Capability::Pause).await {
                Ok(None) => {}
                Ok(Some(why)) => return problem(StatusCode::CONFLICT, &why),
                Err(failure) => return api::unavailable(&failure),
            }
            change.pause(&jobs, until).await
        }
        _ => change.resume(&jobs).await,
    };
    if report.error.is_some() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(report)).into_response();
    }
    if form {
        return Redirect::to(&back_to(body.back.as_deref())).into_response();
    }
    (StatusCode::OK, Json(report)).into_response()
}

/// The jobs `body` names, in the config's order for `all`, else as named without repeats; or why not.
fn selected<'a>(access: &'a Access, body: &ControlBody) -> Result<Vec<&'a JobConfig>, Problem> {
    let jobs = &access.config.jobs;
    match (&body.jobs, body.all) {
        (Some(_), true) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "name the jobs (jobs) or ask for all of them (all), not both",
        )),
        (None, false) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "name the jobs (jobs: a list of names) or ask for all of them (all: true)",
        )),
        (None, true) => Ok(jobs.iter().collect()),
        (Some(names), false) => {
            let mut chosen: Vec<&JobConfig> = Vec::new();
            let mut unknown: Vec<&str> = Vec::new();
            for name in names.names() {
                match jobs.iter().find(|job| job.name == name) {
                    Some(job) if !chosen.iter().any(|c| c.name == name) => chosen.push(job),
                    Some(_) => {}
                    None => unknown.push(name),
                }
            }
            if !unknown.is_empty() {
                let shown: Vec<String> = unknown
                    .iter()
                    .take(UNKNOWN_SHOWN)
                    .map(|name| format!("{name:?}"))
                    .collect();
                let more = unknown.len().saturating_sub(UNKNOWN_SHOWN);
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                let why = format!(
                    "no job named {}{more} in the config in force; nothing was changed",
                    shown.join(", ")
                );
                return Err(Problem::new(StatusCode::NOT_FOUND, &why));
            }
            if chosen.is_empty() {
                return Err(Problem::new(
                    StatusCode::BAD_REQUEST,
                    "jobs names no job: name at least one, or ask for all of them (all: true)",
                ));
            }
            Ok(chosen)
        }
    }
}

/// Where a form's post goes back to: `/` with the query it was posted from, if that is one a page of
/// `/` makes (letters, digits and `%&=+-._~`); else `/`.
fn back_to(back: Option<&str>) -> String {
    let query = back.unwrap_or_default();
    let plain = query.len() <= 1_000
        && query
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "%&=+-._~".contains(c));
    match (plain, query.is_empty()) {
        (true, false) => format!("/?{query}"),
        _ => "/".to_string(),
    }
}

/// A change of several jobs by one operator.
struct Change<'a> {
    dashboard: &'a Dashboard,
    access: &'a Access,
    from: SocketAddr,
    by: String,
    reason: String,
}

impl Change<'_> {
    /// Pauses each of `jobs` until `until`, one after the other.
    async fn pause(
        &self,
        jobs: &[&JobConfig],
        until: Option<chrono::DateTime<chrono::Utc>>,
    ) -> BulkReport {
        let pause = Pause {
            until,
            by: self.by.clone(),
            reason: self.reason.clone(),
        };
        let store = &self.dashboard.context.store();
        let mut report = self.report("pause");
        let mut took_effect = Vec::new();
        let started = Instant::now();
        for (index, job) in jobs.iter().enumerate() {
            if self.out_of_time(started, &mut report, &jobs[index..]) {
                break;
            }
            let stamp = self.dashboard.context.clock().now();
            let outcome = match bounded(store.pause(&job.name, &pause, InForce::KeepLonger)).await {
                Ok(outcome) => outcome,
                Err(failure) => {
                    self.stop(&mut report, &jobs[index..], &failure.to_string(), true);
                    break;
                }
            };
            let (result, paused) = match outcome {
                PauseOutcome::Paused => {
                    took_effect.push((job.name.clone(), stamp));
                    ("paused", Some(pause.clone()))
                }
                PauseOutcome::LongerKept(kept) => ("kept", Some(kept)),
                PauseOutcome::AlreadyOver => {
                    let why =
                        "the pause had ended by the time it reached the store: pause for longer";
                    self.log("pause", &job.name, "already_over");
                    report.not_changed.push(NotChanged {
                        job: job.name.clone(),
                        why: why.to_string(),
                    });
                    continue;
                }
            };
            self.log("pause", &job.name, result);
            report.jobs.push(Changed {
                job: job.name.clone(),
                result,
                paused,
            });
        }
        report.recorded_in_history = self.record(&took_effect, &Control::paused(&pause)).await;
        report
    }

    /// Resumes each of `jobs`, one after the other.
    async fn resume(&self, jobs: &[&JobConfig]) -> BulkReport {
        let store = &self.dashboard.context.store();
        let mut report = self.report("resume");
        let mut took_effect = Vec::new();
        let started = Instant::now();
        for (index, job) in jobs.iter().enumerate() {
            if self.out_of_time(started, &mut report, &jobs[index..]) {
                break;
            }
            let stamp = self.dashboard.context.clock().now();
            let was_paused = match bounded(store.resume(&job.name)).await {
                Ok(was_paused) => was_paused,
                Err(failure) => {
                    self.stop(&mut report, &jobs[index..], &failure.to_string(), true);
                    break;
                }
            };
            let result = if was_paused {
                took_effect.push((job.name.clone(), stamp));
                "resumed"
            } else {
                "was_not_paused"
            };
            self.log("resume", &job.name, result);
            report.jobs.push(Changed {
                job: job.name.clone(),
                result,
                paused: None,
            });
        }
        let control = Control::resumed(self.by.clone(), self.reason.clone());
        report.recorded_in_history = self.record(&took_effect, &control).await;
        report
    }

    fn report(&self, action: &'static str) -> BulkReport {
        BulkReport {
            action,
            by: self.by.clone(),
            jobs: Vec::new(),
            not_changed: Vec::new(),
            recorded_in_history: None,
            error: None,
        }
    }

    /// Whether the request started at `started` has had its [`BULK_TIME`]; then every job of `left` is
    /// not changed, and why.
    fn out_of_time(&self, started: Instant, report: &mut BulkReport, left: &[&JobConfig]) -> bool {
        if started.elapsed() < BULK_TIME {
            return false;
        }
        let why = format!(
            "the request's {} s ran out before this job's turn: change fewer jobs at once, or use `redcron {} --all`",
            BULK_TIME.as_secs(),
            report.action
        );
        self.stop(report, left, &why, false);
        true
    }

    /// The store failed at the first of `left` (`failed`), or its turn never came: every job of `left`
    /// is not changed, and why.
    fn stop(&self, report: &mut BulkReport, left: &[&JobConfig], error: &str, failed: bool) {
        if let (Some(first), true) = (left.first(), failed) {
            self.log(report.action, &first.name, "failed");
        }
        let why = format!("not changed: {error}");
        report.not_changed.extend(left.iter().map(|job| NotChanged {
            job: job.name.clone(),
            why: why.clone(),
        }));
        report.error = Some(error.to_string());
    }

    /// Records `control` of each of `jobs`, with the instant before its change ([`api::record_controls`]);
    /// `None`: nothing to record.
    async fn record(
        &self,
        jobs: &[(String, chrono::DateTime<chrono::Utc>)],
        control: &Control,
    ) -> Option<bool> {
        if jobs.is_empty() {
            return None;
        }
        Some(api::record_controls(self.dashboard, self.access, jobs, control).await)
    }

    fn log(&self, action: &str, job: &str, result: &str) {
        let (operator, reason) = (self.access.operator_name(), self.reason.as_str());
        info!(event = events::dashboard::CONTROL, action, job, operator, from = %self.from,
              reason, result, bulk = true, "Dashboard control used");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_goes_back_to_the_page_it_came_from_and_nowhere_else() {
        assert_eq!(
            back_to(Some("q=etl%2D&state=paused&page=2")),
            "/?q=etl%2D&state=paused&page=2"
        );
        assert_eq!(back_to(None), "/");
        assert_eq!(back_to(Some("")), "/");
        for hostile in [
            "//evil.example",
            "q=1\r\nSet-Cookie: x=1",
            "q=<script>",
            "@evil.example",
            "q=1#frag",
        ] {
            assert_eq!(back_to(Some(hostile)), "/", "{hostile:?}");
        }
        assert_eq!(back_to(Some(&"a".repeat(1_001))), "/");
    }
}
