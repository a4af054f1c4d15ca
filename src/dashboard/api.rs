//! The dashboard's JSON API and its controls.
//!
//! - `GET /api/status`, `GET /api/history?job=J&limit=N`, `GET /api/explain?job=J&tick=T`: the same
//!   documents as `redcron status --json`, `history --json` and `explain --json` (docs/history.md), from
//!   the same [`crate::inspect`] model.
//! - `POST /api/jobs/{name}/pause` (`for`, `reason`), `/resume`, `/trigger`: the same operations as the
//!   command line, through the lock — refused (409) while a live worker of an earlier release would
//!   ignore them, as the CLI refuses without `--even-if-ignored`. Only with `dashboard.controls: true` and a
//!   token. The body is JSON, or a form (the pages' buttons), which is answered with a redirect to the
//!   job's page. Each is logged (`dashboard.control`) with who (the token's name), from where (the peer's
//!   address) and why; the pause and the trigger request carry `<name> via dashboard from <address>` as
//!   their `by`, which `status` shows and the history keeps. A pause written and a resume that lifted a
//!   pause are also recorded in the job's history as a `control` entry (action, by, reason, until,
//!   stamped with the worker's cluster time); a failed history write leaves the control done, is logged
//!   (`dashboard.control_not_recorded`) and answered with `recorded_in_history: false`.
//! - `POST /api/jobs/pause` and `/resume` of several jobs at once are [`super::bulk`]'s, let in by the
//!   same rules ([`admit`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::auth::Proof;
use super::read::{bounded, ReadFailure};
use super::{Access, Dashboard};
use crate::config::JobConfig;
use crate::history::{Control as JobControl, Entry};
use crate::inspect::{explain, history, parse_tick, status};
use crate::lock::{InForce, Pause, PauseOutcome};
use crate::logging::events;
use crate::membership::{self, Capability};
use crate::schedule::Tick;
use crate::trigger::{TriggerRequest, DEFAULT_TIMEOUT};

/// The most ticks `/api/history` lists, as `redcron history --limit`.
const MAX_LIMIT: usize = crate::inspect::history::MAX_LIMIT;
/// The most bytes of JSON `/api/history` answers with: 5,000 ticks with 64 KiB output tails would be
/// over 600 MB. The newest ticks that fit are listed, and `cut_short` says how many were left out.
pub(super) const MAX_HISTORY_BYTES: usize = 16 * 1024 * 1024;
/// The writer (`worker`) of the `control` entries the dashboard records.
const CONTROL_WRITER: &str = "dashboard";
/// The longest pause reason taken.
const MAX_REASON: usize = 500;

/// `GET /api/status`.
pub(super) async fn status(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
) -> Response {
    let store = &dashboard.context.store();
    let now = dashboard.context.clock().now();
    let jobs: Vec<&JobConfig> = access.config.jobs.iter().collect();
    let read = status::read_status(store, &access.config, &jobs, status::ENTRIES_PER_JOB, now);
    match bounded(dashboard.scans.scan(read)).await {
        // Off the runtime's threads, as `/api/history`'s: 10,000 jobs are ~11 MB of JSON.
        Ok(status) => tokio::task::spawn_blocking(move || json(&headers, &status))
            .await
            .unwrap_or_else(|_| {
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the answer could not be written",
                )
            }),
        Err(failure) => unavailable(&failure),
    }
}

/// `GET /api/history?job=J&limit=N`: the newest `N` ticks (default 20) of job `J`, or of every job.
pub(super) async fn history(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let limit = match params.get("limit").map(|l| l.trim().parse::<usize>()) {
        None => 20,
        Some(Ok(limit)) if (1..=MAX_LIMIT).contains(&limit) => limit,
        Some(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("limit is a number from 1 to {MAX_LIMIT}"),
            )
        }
    };
    let jobs: Vec<String> = match params.get("job") {
        Some(name) => match find(&access, name) {
            Ok(job) => vec![job.name.clone()],
            Err(problem) => return problem.into_response(),
        },
        None => access.config.jobs.iter().map(|j| j.name.clone()).collect(),
    };
    let store = &dashboard.context.store();
    let read = history::read(store, &jobs, None, limit);
    // Every job's history is a whole-fleet read: it waits its turn as `/api/status` does.
    let read = if params.contains_key("job") {
        bounded(read).await
    } else {
        bounded(dashboard.scans.scan(read)).await
    };
    match read {
        Ok(mut history) => {
            // Measuring, writing and compressing megabytes is CPU work: off the runtime's threads, so
            // that the lock's renewals and the probes never wait for it.
            let answer = tokio::task::spawn_blocking(move || {
                fit(&mut history, MAX_HISTORY_BYTES);
                json(&headers, &history)
            });
            answer.await.unwrap_or_else(|_| {
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the answer could not be written",
                )
            })
        }
        Err(failure) => unavailable(&failure),
    }
}

/// Cuts `history` to its newest ticks whose entries fit in `budget` bytes of JSON (each entry is
/// listed twice: in `entries` and in its tick; the first tick is kept whatever its size), with the
/// controls since the oldest tick kept; `cut_short` says what was left out.
fn fit(history: &mut history::History, budget: usize) {
    let size = |entry: &Entry| serde_json::to_vec(entry).map_or(0, |json| json.len() + 64);
    let mut used = 0;
    let mut kept = 0;
    for record in &history.ticks {
        let cost: usize = record.entries().map(|entry| 2 * size(entry)).sum();
        if kept > 0 && used + cost > budget {
            break;
        }
        used += cost;
        kept += 1;
    }
    let total = history.ticks.len();
    if kept == total {
        return;
    }
    history.ticks.truncate(kept);
    let listed: std::collections::HashSet<_> = history
        .ticks
        .iter()
        .map(|record| {
            (
                record.job().to_string(),
                record.record.tick,
                record.series(),
            )
        })
        .collect();
    let oldest = history.ticks.last().map_or(i64::MIN, |r| r.record.tick);
    history.controls.retain(|control| control.tick >= oldest);
    history.entries.retain(|entry| {
        if entry.is_control() {
            entry.tick >= oldest
        } else {
            listed.contains(&(entry.job.clone(), entry.tick, entry.series()))
        }
    });
    let cut = format!(
        "the answer is cut at {} MiB: the newest {kept} of {total} ticks are listed; ask for fewer \
         (limit) or for one job",
        budget / (1024 * 1024)
    );
    history.cut_short = Some(match history.cut_short.take() {
        Some(earlier) => format!("{earlier}; {cut}"),
        None => cut,
    });
}

/// `GET /api/explain?job=J&tick=T`: one tick's story; `T` in RFC 3339 or epoch milliseconds.
pub(super) async fn explain(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(name) = params.get("job") else {
        return problem(StatusCode::BAD_REQUEST, "job is required");
    };
    let job = match find(&access, name) {
        Ok(job) => job,
        Err(problem) => return problem.into_response(),
    };
    let tick = match params.get("tick").map(|t| parse_tick(t.trim())) {
        None => {
            return problem(
                StatusCode::BAD_REQUEST,
                "tick is required (RFC 3339 or epoch milliseconds)",
            )
        }
        Some(Err(why)) => return problem(StatusCode::BAD_REQUEST, &why),
        Some(Ok(at)) => Tick(at.timestamp_millis()),
    };
    let store = &dashboard.context.store();
    match bounded(explain::read(store, &job.name, tick)).await {
        Ok(inputs) => {
            let now = dashboard.context.clock().now();
            let story = explain::explain(job, &access.config.history, tick, inputs, now);
            json(&headers, &story)
        }
        Err(failure) => unavailable(&failure),
    }
}

/// What a control's body may say.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ControlBody {
    /// How long a pause lasts (90s, 30m, 2h); none or empty: until resumed.
    #[serde(default, rename = "for")]
    duration: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    /// The session's CSRF token (forms).
    #[serde(default)]
    csrf: Option<String>,
    /// Several jobs' controls ([`super::bulk`]): the jobs, a JSON array of names or, from a form, names
    /// separated by white space.
    #[serde(default)]
    pub(super) jobs: Option<Names>,
    /// Several jobs' controls: every job of the config in force, instead of `jobs`.
    #[serde(default)]
    pub(super) all: bool,
    /// Several jobs' controls from a form: the query of the page it was posted from, to go back to.
    #[serde(default)]
    pub(super) back: Option<String>,
}

/// Job names as a body gives them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Names {
    List(Vec<String>),
    Text(String),
}

impl Names {
    /// The names, in order.
    pub(super) fn names(&self) -> Vec<&str> {
        match self {
            Names::List(names) => names.iter().map(String::as_str).collect(),
            Names::Text(text) => text.split_whitespace().collect(),
        }
    }
}

impl ControlBody {
    /// The operator's reason as the form sent it: trimmed, at most [`MAX_REASON`] characters.
    pub(super) fn reason(&self) -> String {
        let reason = self.reason.as_deref().unwrap_or_default().trim();
        reason.chars().take(MAX_REASON).collect()
    }

    /// When a pause of `for` asked now ends (`None`: until resumed), or why `for` is not a duration.
    pub(super) fn until(&self) -> Result<Option<chrono::DateTime<Utc>>, String> {
        match self.duration.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => crate::lock::Pause::parse_for(text).map(|duration| {
                Some(Utc::now() + chrono::Duration::from_std(duration).unwrap_or_default())
            }),
        }
    }
}

/// A control request let in ([`admit`]): its body, whether it came from a form (answered with a
/// redirect), and the `by` its pause or trigger request carries.
pub(super) struct Admitted {
    pub(super) body: ControlBody,
    pub(super) form: bool,
    pub(super) by: String,
}

/// Lets a control request in if it may use the controls: controls on, a token proven, a body that
/// parses, and with the session's cookie the session's CSRF token.
pub(super) fn admit(
    access: &Access,
    from: SocketAddr,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Admitted, Problem> {
    if !access.config.dashboard.controls {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "the controls are off (dashboard.controls is false)",
        ));
    }
    let Some(operator) = &access.operator else {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "the controls need a dashboard token",
        ));
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let form = content_type.starts_with("application/x-www-form-urlencoded");
    let body: ControlBody = if body.is_empty() {
        ControlBody::default()
    } else if form {
        serde_urlencoded::from_bytes(body).map_err(|e| {
            Problem::new(
                StatusCode::BAD_REQUEST,
                &format!("the form does not parse: {e}"),
            )
        })?
    } else if content_type.starts_with("application/json") {
        serde_json::from_slice(body).map_err(|e| {
            Problem::new(
                StatusCode::BAD_REQUEST,
                &format!("the JSON body does not parse: {e}"),
            )
        })?
    } else {
        let why = "send application/json or application/x-www-form-urlencoded";
        return Err(Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, why));
    };
    if operator.via == Proof::Cookie {
        let candidate = body
            .csrf
            .clone()
            .or_else(|| {
                headers
                    .get("x-csrf-token")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let session = operator.session.as_deref().unwrap_or("");
        if !access.keys.check_csrf(&operator.name, session, &candidate) {
            let why = "the form's CSRF token is missing or not this session's: reload the page";
            return Err(Problem::new(StatusCode::FORBIDDEN, why));
        }
    }
    Ok(Admitted {
        body,
        form,
        by: format!("{} via dashboard from {}", operator.name, from.ip()),
    })
}

/// What a control answers in JSON.
#[derive(Debug, Serialize)]
struct ControlReport {
    job: String,
    action: &'static str,
    /// `paused`, `kept` (a longer pause in force stays), `resumed`, `was_not_paused`, `requested`.
    result: &'static str,
    by: String,
    /// The pause in force after a pause (the longer one kept), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    paused: Option<Pause>,
    /// The trigger request written.
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<TriggerRequest>,
    /// For a pause written or a resume that lifted a pause: whether its `control` entry reached the
    /// history. Absent when nothing was to be recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    recorded_in_history: Option<bool>,
}

/// The controls' one request shape: what was asked, by whom, from where.
struct Control<'a> {
    dashboard: &'a Dashboard,
    access: &'a Access,
    job: &'a JobConfig,
    body: ControlBody,
    /// A form post (answered with a redirect), not JSON.
    form: bool,
    by: String,
    from: SocketAddr,
}

/// `POST /api/jobs/{name}/{action}`: `pause`, `resume` or `trigger`.
pub(super) async fn control(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !matches!(action.as_str(), "pause" | "resume" | "trigger") {
        let why = format!("no control {action:?}: pause, resume or trigger");
        return problem(StatusCode::NOT_FOUND, &why);
    }
    let control = match Control::admit(&dashboard, &access, &name, from, &headers, &body) {
        Ok(control) => control,
        Err(problem) => return problem.into_response(),
    };
    match action.as_str() {
        "pause" => control.pause().await,
        "resume" => control.resume().await,
        _ => control.trigger().await,
    }
}

impl<'a> Control<'a> {
    /// The operator's reason as the form sent it: trimmed, at most [`MAX_REASON`] characters.
    fn reason(&self) -> String {
        self.body.reason()
    }

    /// The control asked for, if this request may use it ([`admit`]) on a job of the config.
    fn admit(
        dashboard: &'a Dashboard,
        access: &'a Access,
        name: &str,
        from: SocketAddr,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Control<'a>, Problem> {
        let Admitted { body, form, by } = admit(access, from, headers, body)?;
        let job = find(access, name)?;
        Ok(Control {
            dashboard,
            access,
            job,
            body,
            form,
            by,
            from,
        })
    }

    async fn pause(self) -> Response {
        let until = match self.body.until() {
            Ok(until) => until,
            Err(why) => return problem(StatusCode::BAD_REQUEST, &why),
        };
        let reason = self.reason();
        if let Err(response) = self.honoured(Capability::Pause).await {
            return response;
        }
        let pause = Pause {
            until,
            by: self.by.clone(),
            reason: reason.clone(),
        };
        let store = &self.dashboard.context.store();
        let stamp = self.dashboard.context.clock().now();
        let outcome = match bounded(store.pause(&self.job.name, &pause, InForce::KeepLonger)).await
        {
            Ok(outcome) => outcome,
            Err(failure) => return self.failed("pause", &failure),
        };
        let (result, paused, recorded) = match outcome {
            PauseOutcome::Paused => {
                let control = JobControl::paused(&pause);
                (
                    "paused",
                    Some(pause),
                    Some(self.record(&control, stamp).await),
                )
            }
            PauseOutcome::LongerKept(kept) => ("kept", Some(kept), None),
            PauseOutcome::AlreadyOver => ("already_over", None, None),
        };
        self.done("pause", result, paused, None, &reason, recorded)
    }

    async fn resume(self) -> Response {
        let store = &self.dashboard.context.store();
        let stamp = self.dashboard.context.clock().now();
        let was_paused = match bounded(store.resume(&self.job.name)).await {
            Ok(was) => was,
            Err(failure) => return self.failed("resume", &failure),
        };
        let reason = self.reason();
        let (result, recorded) = if was_paused {
            let control = JobControl::resumed(self.by.clone(), reason.clone());
            ("resumed", Some(self.record(&control, stamp).await))
        } else {
            ("was_not_paused", None)
        };
        self.done("resume", result, None, None, &reason, recorded)
    }

    /// Records `control` of the job, stamped `stamp`, in its history ([`record_controls`]); whether a
    /// majority took it.
    async fn record(&self, control: &JobControl, stamp: DateTime<Utc>) -> bool {
        let jobs = [(self.job.name.clone(), stamp)];
        record_controls(self.dashboard, self.access, &jobs, control).await
    }

    async fn trigger(self) -> Response {
        if !self.job.enabled {
            let why = format!(
                "job {:?} is disabled (enabled: false): no worker runs it",
                self.job.name
            );
            return problem(StatusCode::CONFLICT, &why);
        }
        if let Err(response) = self.honoured(Capability::Trigger).await {
            return response;
        }
        let now = self.dashboard.context.clock().now();
        let request = TriggerRequest::new(&self.job.name, now, DEFAULT_TIMEOUT, &self.by);
        let store = &self.dashboard.context.store();
        if let Err(failure) = bounded(store.request_trigger(&request)).await {
            return self.failed("trigger", &failure);
        }
        let reason = self.body.reason.clone().unwrap_or_default();
        self.done("trigger", "requested", None, Some(request), &reason, None)
    }

    /// Refuses (409) while a live worker would ignore `capability`.
    async fn honoured(&self, capability: Capability) -> Result<(), Response> {
        match ignored(self.dashboard, capability).await {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(problem(StatusCode::CONFLICT, &why)),
            Err(failure) => Err(self.failed(capability.name(), &failure)),
        }
    }

    fn failed(&self, action: &str, failure: &ReadFailure) -> Response {
        self.log(action, "failed", "");
        unavailable(failure)
    }

    fn done(
        &self,
        action: &'static str,
        result: &'static str,
        paused: Option<Pause>,
        request: Option<TriggerRequest>,
        reason: &str,
        recorded_in_history: Option<bool>,
    ) -> Response {
        self.log(action, result, reason);
        if self.form {
            let mut to = format!("/jobs/{}", super::pages::encode_path(&self.job.name));
            if let Some(request) = &request {
                to.push_str(&format!("?trigger={}#trigger", request.id));
            }
            return Redirect::to(&to).into_response();
        }
        let status = if request.is_some() {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        let report = ControlReport {
            job: self.job.name.clone(),
            action,
            result,
            by: self.by.clone(),
            paused,
            request,
            recorded_in_history,
        };
        (status, Json(report)).into_response()
    }

    fn log(&self, action: &str, result: &str, reason: &str) {
        let operator = self.access.operator_name();
        info!(event = events::dashboard::CONTROL, action, job = %self.job.name, operator,
              from = %self.from, reason, result, "Dashboard control used");
    }
}

/// Records `control` of each of `jobs` in their histories, in one write, each stamped with the worker's
/// cluster time taken just before its change was written (so every tick the change can have affected
/// comes after it); whether a majority took it. A failure is logged, not answered as an error: the controls
/// themselves are done and stay done.
pub(super) async fn record_controls(
    dashboard: &Dashboard,
    access: &Access,
    jobs: &[(String, DateTime<Utc>)],
    control: &JobControl,
) -> bool {
    let entries: Vec<Entry> = jobs
        .iter()
        .map(|(job, stamp)| Entry::control(job, control, CONTROL_WRITER, *stamp))
        .collect();
    match bounded(dashboard.context.store().record(&entries)).await {
        Ok(()) => true,
        Err(failure) => {
            let names: Vec<&str> = jobs.iter().map(|(job, _)| job.as_str()).collect();
            let names = names.join(" ");
            warn!(event = events::dashboard::CONTROL_NOT_RECORDED, action = control.action,
                  job = %names, operator = access.operator_name(), error = %failure,
                  "Dashboard control done, but not recorded in the history");
            false
        }
    }
}

/// Why `capability` is refused now — live workers of an earlier release would ignore it — or `None`.
pub(super) async fn ignored(
    dashboard: &Dashboard,
    capability: Capability,
) -> Result<Option<String>, ReadFailure> {
    let members = bounded(dashboard.context.store().members()).await?.value;
    let ignoring: Vec<String> = membership::ignoring(&members, capability)
        .into_iter()
        .map(|m| format!("{} (host {}, version {:?})", m.id, m.host, m.version))
        .collect();
    Ok((!ignoring.is_empty()).then(|| {
        format!(
            "not done: live workers of an earlier release ignore it: {}; upgrade them first (the command \
             line's --even-if-ignored goes on anyway)",
            ignoring.join(", ")
        )
    }))
}

/// The job `name` of the config in force, or a 404.
pub(super) fn find<'a>(access: &'a Access, name: &str) -> Result<&'a JobConfig, Problem> {
    access
        .config
        .jobs
        .iter()
        .find(|job| job.name == name)
        .ok_or_else(|| {
            Problem::new(
                StatusCode::NOT_FOUND,
                &format!("no job named {name:?} in the config in force"),
            )
        })
}

/// An error answer: its status and `{"error": why}`.
pub(super) struct Problem(StatusCode, String);

impl Problem {
    pub(super) fn new(status: StatusCode, why: &str) -> Problem {
        Problem(status, why.to_string())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// An error answer: `{"error": why}`.
/// `value` as JSON, gzipped for a client that takes it (`/api/status` of 10,000 jobs is ~11 MB of text).
fn json(headers: &HeaderMap, value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => super::pages::compressed_as(headers, text, "application/json"),
        Err(why) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot write the answer as JSON: {why}"),
        ),
    }
}

pub(super) fn problem(status: StatusCode, why: &str) -> Response {
    Problem(status, why.to_string()).into_response()
}

/// 503 with why the store could not be read.
pub(super) fn unavailable(failure: &ReadFailure) -> Response {
    problem(StatusCode::SERVICE_UNAVAILABLE, &failure.to_string())
}
