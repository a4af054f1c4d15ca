//! The dashboard's HTML pages, rendered on the server with maud, which escapes every value it is given
//! (a job named `<script>` is shown as text); the only markup not escaped here is the chart's SVG, which
//! [`super::chart`] escapes itself. Pages work with JavaScript off: forms post, links page. Each answer
//! carries an `ETag` of its body, and a request whose `If-None-Match` names it gets `304`: the script that
//! keeps a page live (`/assets/app.js`) asks that way.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;

use super::read::{self, ReadFailure};
use super::view::{self, Cell, Filter, StateFilter};
use super::{auth, chart, words, Access, Dashboard};
use crate::config::{Command, Config, JobConfig};
use crate::history::tick::TickRecord;
use crate::history::{Entry, Kind};
use crate::inspect::status::{JobStatus, WorkerStatus};
use crate::inspect::time::{duration_ms, instant_ms};
use crate::inspect::{explain, history, parse_tick};
use crate::schedule::Tick;

/// Ticks listed in a job's history table and chart.
const JOB_TICKS: usize = 100;
/// The script that keeps pages live, and the style sheet.
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

/// `GET /`: every job of the config, filtered and paged.
pub(super) async fn index(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let filter = Filter::from_params(&params);
    let store = &dashboard.context.store();
    let now = dashboard.context.clock().now();
    let timing = Timing::start();
    let mut overview =
        match read::overview(store, &dashboard.scans, &access.config, &filter, now).await {
            Ok(overview) => overview,
            Err(failure) => return unavailable(&access, "Jobs", &failure),
        };
    let timing = timing.read();
    let config = &access.config;
    let by_name: HashMap<&str, &JobConfig> =
        config.jobs.iter().map(|j| (j.name.as_str(), j)).collect();
    // Jobs of a fleet share a few schedules: each is worded once.
    let mut worded: HashMap<(&str, &str), String> = HashMap::new();
    let entries = std::mem::take(&mut overview.entries);
    let rows: Vec<_> = overview
        .status
        .jobs
        .iter()
        .zip(entries)
        .map(|(status, entries)| {
            let schedule = by_name.get(status.name.as_str()).map(|job| {
                let key = (job.schedule.expression(), job.schedule.timezone().name());
                worded
                    .entry(key)
                    .or_insert_with(|| words::describe(key.0, key.1))
                    .clone()
            });
            (status, schedule, view::strip(entries, view::STRIP))
        })
        .collect();
    let body = html! {
        h1 { "Jobs" }
        (filter_form(&filter))
        p.summary {
            (overview.total) " of " (config.jobs.len()) " jobs"
            @if overview.pages > 1 { " · page " (overview.page) " of " (overview.pages) }
            @if !overview.status.notes.missing_nodes.is_empty() {
                " · " strong { (overview.status.notes.missing_nodes.len()) " store node(s) did not answer" }
            }
        }
        @if overview.total == 0 {
            p.empty { "No job matches." }
        } @else {
            table #jobs {
                thead { tr {
                    th scope="col" { "Job" } th scope="col" { "Schedule" } th scope="col" { "Next tick" }
                    th scope="col" { "Last run" } th scope="col" { "Failures in a row" }
                    th scope="col" { "State" } th scope="col" { "Recent ticks (oldest first)" }
                } }
                tbody {
                    @for (status, schedule, strip) in &rows {
                        tr data-job=(status.name) data-paused=(status.paused.is_some()) {
                            th scope="row" { a href={ "/jobs/" (encode_path(&status.name)) } { (status.name) } }
                            td { @if let Some(schedule) = schedule { (schedule) } }
                            td { (when(status.next_tick)) }
                            td { (last_run(status)) }
                            td.number { (status.failures_in_a_row) }
                            td { (state(status)) }
                            td { (strip_of(strip)) }
                        }
                    }
                }
            }
            (pager(&filter, overview.page, overview.pages))
            @if access.may_control() {
                (bulk_controls(&rows, &filter, overview.page, access.csrf()))
            }
        }
    };
    page(&headers, &access, "Jobs", body, timing)
}

/// `GET /jobs/{name}`: one job, its timeline and history; `?tick=` adds a tick's story, `?trigger=` the
/// state of a trigger request.
pub(super) async fn job(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let config = &access.config;
    let Some(job) = config.jobs.iter().find(|j| j.name == name) else {
        let body = html! { h1 { "No such job" } p { "The config in force has no job named " code { (name) } "." } };
        let page = page(
            &headers,
            &access,
            "No such job",
            body,
            Timing::start().read(),
        );
        return with_status(StatusCode::NOT_FOUND, page);
    };
    let store = &dashboard.context.store();
    let now = dashboard.context.clock().now();
    let timing = Timing::start();
    let (status, _) =
        match read::status_of(store, config, &[job], view::ENTRIES_FOR_STRIP, now).await {
            Ok(found) => found,
            Err(failure) => return unavailable(&access, &job.name, &failure),
        };
    let names = [job.name.clone()];
    let (ticks, paused_resumed) =
        match read::bounded(history::read(store, &names, None, JOB_TICKS)).await {
            Ok(listed) => (listed.ticks, listed.controls),
            Err(failure) => return unavailable(&access, &job.name, &failure),
        };
    let story = match params.get("tick").map(|t| parse_tick(t.trim())) {
        None => None,
        Some(Err(why)) => Some(Err(why)),
        Some(Ok(at)) => {
            let tick = Tick(at.timestamp_millis());
            match read::bounded(explain::read(store, &job.name, tick)).await {
                Ok(inputs) => Some(Ok(explain::explain(
                    job,
                    &config.history,
                    tick,
                    inputs,
                    now,
                ))),
                Err(failure) => return unavailable(&access, &job.name, &failure),
            }
        }
    };
    let timing = timing.read();
    let Some(job_status) = status.jobs.first() else {
        return unavailable(&access, &job.name, &ReadFailure::Timeout);
    };
    let trigger = params
        .get("trigger")
        .map(|id| trigger_state(id, &ticks, job_status));
    let cells: Vec<Cell> = ticks.iter().rev().map(Cell::of).collect();
    let body = html! {
        h1 { (job.name) }
        (job_state(job, job_status))
        dl.facts {
            dt { "Schedule" } dd { (words::describe(job.schedule.expression(), job.schedule.timezone().name()))
                " " code { (job.schedule.expression()) } " (" (job.schedule.timezone().name()) ")" }
            dt { "Command" } dd { code { (command(job)) } }
            dt { "Next tick" } dd { (when(job_status.next_tick)) }
            dt { "Last run" } dd { (last_run(job_status)) }
            dt { "Last success" } dd { @match &job_status.last_success { Some(run) => (instant_ms(run.tick)), None => "none in the history read" } }
            dt { "Failures in a row" } dd { (job_status.failures_in_a_row) }
            @if let Some(overdue) = &job_status.overdue {
                dt { "Overdue" } dd { "nobody accounted for the tick " (instant(overdue.tick)) " (window ended " (instant(overdue.window_ended_at)) ")" }
            }
            @if !job_status.running.is_empty() {
                dt { "Running now" } dd { @for run in &job_status.running { (run.worker) " (token " (run.token) ", tick " (instant_ms(run.tick)) ") " } }
            }
        }
        @if access.may_control() { (controls(job, job_status, access.csrf())) }
        @else if access.config.dashboard.controls {
            p.note { "Log in with a token to pause, resume or trigger this job." }
        }
        @if let Some((state, text)) = &trigger {
            section #trigger data-state=(state) aria-live="polite" { h2 { "Trigger" } p { (text) } }
        }
        @match &story {
            Some(Ok(explanation)) => section #explain aria-live="polite" {
                h2 { "Tick " (instant(explanation.tick)) }
                p { "Verdict: " strong { (serde_json::to_value(explanation.verdict).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()) } }
                ol.story { @for line in &explanation.story { li { (line) } } }
                @if let Some(hint) = &explanation.hint { p.note { (hint) } }
                @for run in &explanation.runs {
                    @if let Some(out) = &run.tail_out { h3 { "Standard output (end)" } pre { (out) } }
                    @if let Some(err) = &run.tail_err { h3 { "Standard error (end)" } pre { (err) } }
                }
            },
            Some(Err(why)) => section #explain { h2 { "Tick" } p.error { (why) } },
            None => {},
        }
        h2 { "Timeline" }
        (PreEscaped(chart::timeline(&cells)))
        h2 { "History" }
        @if ticks.is_empty() { p.empty { "No tick recorded yet." } } @else {
            table #history {
                thead { tr {
                    th scope="col" { "Tick" } th scope="col" { "Outcome" } th scope="col" { "Worker" }
                    th scope="col" { "Token" } th scope="col" { "Attempt" } th scope="col" { "Trigger" }
                    th scope="col" { "Exit" } th scope="col" { "Duration" } th scope="col" { "Start delay" }
                } }
                tbody { @for record in &ticks { (history_row(job, record)) } }
            }
        }
        @if !paused_resumed.is_empty() {
            h2 { "Pauses and resumes" }
            table #controls {
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Action" } th scope="col" { "By" }
                    th scope="col" { "Reason" } th scope="col" { "Until" }
                } }
                tbody { @for control in &paused_resumed { (control_row(control)) } }
            }
        }
    };
    page(&headers, &access, &job.name, body, timing)
}

/// `GET /workers`: the workers the store knows, and the store's nodes.
pub(super) async fn workers(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
) -> Response {
    let store = &dashboard.context.store();
    let now = dashboard.context.clock().now();
    let config = &access.config;
    let timing = Timing::start();
    let (status, _) = match read::status_of(store, config, &[], 0, now).await {
        Ok(found) => found,
        Err(failure) => return unavailable(&access, "Workers", &failure),
    };
    let timing = timing.read();
    let max_offset = config.worker.max_clock_offset.as_millis() as i64;
    let missing: Vec<&str> = status
        .notes
        .missing_nodes
        .iter()
        .map(|m| m.node.as_str())
        .collect();
    let nodes = store.nodes();
    let groups = store.groups();
    let body = html! {
        h1 { "Workers" }
        @if let Some(majority) = &status.config_majority {
            p.summary { "Config most live workers run: " code { (majority) } }
        }
        @if status.workers.is_empty() { p.empty { "No worker has announced itself." } } @else {
            table #workers {
                thead { tr {
                    th scope="col" { "Worker" } th scope="col" { "State" } th scope="col" { "Host" }
                    th scope="col" { "PID" } th scope="col" { "Version" } th scope="col" { "Started" }
                    th scope="col" { "Last seen" } th scope="col" { "Clock offset" }
                    th scope="col" { "Config" } th scope="col" { "Runs under way" }
                } }
                tbody { @for worker in &status.workers { (worker_row(worker, max_offset)) } }
            }
        }
        h2 { "Store" }
        table #nodes {
            thead { tr {
                th scope="col" { "Node" } th scope="col" { "Answering" }
                @if !groups.is_empty() { th scope="col" { "Master" } th scope="col" { "Failovers seen" } }
            } }
            tbody {
                @for node in &nodes {
                    @let down = missing.iter().find(|m| **m == node.as_str() || node.ends_with(*m) || m.ends_with(node.as_str()));
                    @let group = groups.iter().find(|group| group.group == *node);
                    tr data-node=(node) data-up=(down.is_none()) {
                        th scope="row" { (node) }
                        td { @match down { Some(_) => span.bad { "no" }, None => span.good { "yes" } } }
                        @if !groups.is_empty() { (group_cells(group)) }
                    }
                    // A Redis Cluster's shards, each named by the node and its slots.
                    @for shard in groups.iter().filter(|g| g.group.starts_with(&format!("{node} "))) {
                        tr data-node=(shard.group) data-up=(down.is_none()) {
                            th scope="row" { (shard.group) }
                            td { @match down { Some(_) => span.bad { "no" }, None => span.good { "yes" } } }
                            (group_cells(Some(shard)))
                        }
                    }
                }
            }
        }
        @for missing in &status.notes.missing_nodes { p.error { (missing.node) ": " (missing.error) } }
    };
    page(&headers, &access, "Workers", body, timing)
}

/// `GET /login`.
pub(super) async fn login_form(
    State(dashboard): State<Arc<Dashboard>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let config = dashboard.context.config();
    if let Some(refused) = super::refuse(
        &dashboard,
        &config,
        &axum::http::Method::GET,
        &HeaderMap::new(),
    ) {
        return refused;
    }
    let next = params.get("next").map(String::as_str).unwrap_or("/");
    login_page(&config, next, None, StatusCode::OK)
}

/// What `POST /login` takes.
#[derive(Deserialize)]
pub(super) struct Login {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

/// `POST /login`: a valid token sets the session cookie and goes on to `next` (a path of this site);
/// a wrong one is answered after [`auth::FAILED_ATTEMPT_DELAY`], and one within a second of its
/// address's last failure is not checked (429, [`super::attempts`]).
pub(super) async fn login(
    State(dashboard): State<Arc<Dashboard>>,
    ConnectInfo(from): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Response {
    let config = dashboard.context.config();
    if let Some(refused) = super::refuse(&dashboard, &config, &axum::http::Method::POST, &headers) {
        return refused;
    }
    let keys = dashboard.keys(&config);
    let next = safe_next(&login.next);
    let checked = dashboard
        .attempt(Some(from), || keys.check(login.token.trim()).ok_or(()))
        .await;
    let name = match checked {
        super::attempts::Attempt::Passed(name) => name,
        super::attempts::Attempt::Failed => {
            let why = if keys.any() {
                "That is not a dashboard token."
            } else {
                "This dashboard has no token: nobody logs in."
            };
            return login_page(&config, next, Some(why), StatusCode::UNAUTHORIZED);
        }
        super::attempts::Attempt::Cooling => {
            let why = "A wrong token came from this address less than a second ago: try again.";
            return login_page(&config, next, Some(why), StatusCode::TOO_MANY_REQUESTS);
        }
    };
    // A cookie is its name and second: one issued again in the second of a logout that ended it would
    // be the ended one, so it is issued a second later (a minute ahead is accepted).
    let now = Utc::now().timestamp();
    let session = (0..60)
        .map(|ahead| keys.session(&name, now + ahead))
        .find(|session| {
            session
                .as_deref()
                .is_none_or(|s| !dashboard.revoked.is_revoked(s))
        })
        .flatten();
    let Some(session) = session else {
        return login_page(
            &config,
            next,
            Some("The token was removed."),
            StatusCode::UNAUTHORIZED,
        );
    };
    let secure = headers
        .get("x-forwarded-proto")
        .is_some_and(|p| p == "https");
    tracing::info!(event = crate::logging::events::dashboard::LOGIN, operator = %name, "Dashboard login");
    (
        [(header::SET_COOKIE, auth::set_cookie(&session, secure))],
        Redirect::to(next),
    )
        .into_response()
}

/// `POST /logout`: ends the session: this worker no longer accepts its cookie ([`super::revoked`]),
/// and the browser is told to drop it.
pub(super) async fn logout(
    State(dashboard): State<Arc<Dashboard>>,
    Extension(access): Extension<Access>,
) -> Response {
    if let Some(session) = access.operator.as_ref().and_then(|o| o.session.as_deref()) {
        dashboard.revoked.revoke(session, Utc::now().timestamp());
    }
    (
        [(header::SET_COOKIE, auth::clear_cookie())],
        Redirect::to("/login"),
    )
        .into_response()
}

pub(super) async fn script(State(dashboard): State<Arc<Dashboard>>) -> Response {
    asset(&dashboard, "text/javascript; charset=utf-8", SCRIPT)
}

pub(super) async fn style(State(dashboard): State<Arc<Dashboard>>) -> Response {
    asset(&dashboard, "text/css; charset=utf-8", STYLE)
}

/// An embedded file, where the dashboard is served (needing no token: it holds nothing of the cluster).
fn asset(dashboard: &Dashboard, content_type: &'static str, body: &'static str) -> Response {
    let config = dashboard.context.config();
    if let Some(refused) = super::refuse(
        dashboard,
        &config,
        &axum::http::Method::GET,
        &HeaderMap::new(),
    ) {
        return refused;
    }
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

fn login_page(config: &Config, next: &str, error: Option<&str>, status: StatusCode) -> Response {
    let body = html! {
        h1 { "Log in" }
        @if let Some(error) = error { p.error role="alert" { (error) } }
        @if config.dashboard.tokens.is_empty() {
            p { "This dashboard needs no token: " a href="/" { "go to the jobs" } "." }
        }
        form #login method="post" action="/login" {
            input type="hidden" name="next" value=(safe_next(next));
            label for="token" { "Dashboard token" }
            input #token type="password" name="token" autocomplete="current-password" required autofocus;
            button type="submit" { "Log in" }
        }
        @if !config.dashboard.tokens.is_empty() {
            p.note {
                "The tokens are in the workers' config file: " code { "dashboard.token" } ", or one per "
                "person in " code { "dashboard.tokens" } " (docs/configuration.md). Ask whoever runs "
                "redcron for yours."
            }
        }
    };
    let html = layout("Log in", None, None, body);
    (status, html_headers(), html.into_string()).into_response()
}

/// `next` if it is a path of this site, else `/`: a login never sends anyone elsewhere.
fn safe_next(next: &str) -> &str {
    let local =
        next.starts_with('/') && !next.starts_with("//") && !next.contains(['\\', '\r', '\n']);
    if local && next.len() <= 2048 {
        next
    } else {
        "/"
    }
}

/// How long a page took: its reads from the store, then its rendering (`Server-Timing`, which a
/// browser's developer tools show and the benchmark reads; the compression of the answer follows as
/// `gzip`).
struct Timing {
    started: std::time::Instant,
    read: Option<std::time::Duration>,
}

impl Timing {
    fn start() -> Timing {
        Timing {
            started: std::time::Instant::now(),
            read: None,
        }
    }

    /// The reads are done: what follows is rendering.
    fn read(self) -> Timing {
        Timing {
            started: std::time::Instant::now(),
            read: Some(self.started.elapsed()),
        }
    }

    /// `store;dur=<ms>, render;dur=<ms>`.
    fn header(&self) -> String {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        format!(
            "store;dur={:.2}, render;dur={:.2}",
            ms(self.read.unwrap_or_default()),
            ms(self.started.elapsed())
        )
    }
}

/// The whole page around `body`, with its ETag; `304` when the request already has it.
fn page(
    headers: &HeaderMap,
    access: &Access,
    title: &str,
    body: Markup,
    timing: Timing,
) -> Response {
    let operator = access.operator.as_ref().map(|o| o.name.as_str());
    let text = layout(title, operator, access.csrf(), body).into_string();
    let etag = format!("\"{:016x}\"", crate::lock::order::fnv1a(text.as_bytes()));
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|tag| tag.as_bytes() == etag.as_bytes())
    {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    let rendered = timing.header();
    let compressing = std::time::Instant::now();
    let mut response = compressed(headers, text);
    let gzip = compressing.elapsed().as_secs_f64() * 1000.0;
    if let Ok(value) = etag.parse() {
        response.headers_mut().insert(header::ETAG, value);
    }
    if let Ok(value) = format!("{rendered}, gzip;dur={gzip:.2}").parse() {
        response.headers_mut().insert("server-timing", value);
    }
    response
}

/// `text` as HTML, gzipped when the client takes gzip and it is worth it.
fn compressed(headers: &HeaderMap, text: String) -> Response {
    compressed_as(headers, text, "text/html; charset=utf-8")
}

/// `text` of `content_type`, gzipped when the client takes gzip and it is worth it (an answer beyond one
/// packet).
pub(super) fn compressed_as(
    headers: &HeaderMap,
    text: String,
    content_type: &'static str,
) -> Response {
    use std::io::Write as _;
    let takes_gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim().starts_with("gzip")));
    if takes_gzip && text.len() > 1400 {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        if encoder.write_all(text.as_bytes()).is_ok() {
            if let Ok(gzipped) = encoder.finish() {
                let encoding = [
                    (header::CONTENT_ENCODING, "gzip"),
                    (header::VARY, "Accept-Encoding"),
                ];
                return ([(header::CONTENT_TYPE, content_type)], encoding, gzipped).into_response();
            }
        }
    }
    let mut response = ([(header::CONTENT_TYPE, content_type)], text).into_response();
    response.headers_mut().insert(
        header::VARY,
        header::HeaderValue::from_static("Accept-Encoding"),
    );
    response
}

fn html_headers() -> [(header::HeaderName, &'static str); 1] {
    [(header::CONTENT_TYPE, "text/html; charset=utf-8")]
}

fn with_status(status: StatusCode, mut response: Response) -> Response {
    *response.status_mut() = status;
    response
}

/// The page saying the store could not be read (503).
fn unavailable(access: &Access, title: &str, failure: &ReadFailure) -> Response {
    let operator = access.operator.as_ref().map(|o| o.name.as_str());
    let body = html! { h1 { (title) } p.error role="alert" { "Cannot show this page: " (failure.to_string()) "." } };
    let text = layout(title, operator, access.csrf(), body).into_string();
    (StatusCode::SERVICE_UNAVAILABLE, html_headers(), text).into_response()
}

fn layout(title: &str, operator: Option<&str>, csrf: Option<String>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(csrf) = &csrf { meta name="csrf-token" content=(csrf); }
                title { (title) " · redcron" }
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/app.js" defer {}
            }
            body {
                a.skip href="#content" { "Skip to content" }
                header {
                    nav aria-label="Main" {
                        span.brand { "redcron" }
                        a href="/" { "Jobs" }
                        a href="/workers" { "Workers" }
                        @if let Some(name) = operator {
                            span.who { "Logged in as " (name) }
                            form.inline method="post" action="/logout" { button type="submit" { "Log out" } }
                        }
                    }
                }
                main #content data-live="true" { (body) }
            }
        }
    }
}

fn filter_form(filter: &Filter) -> Markup {
    html! {
        form #filter method="get" action="/" role="search" {
            label for="q" { "Name contains" }
            input #q type="search" name="q" value=(filter.query);
            label for="state" { "State" }
            select #state name="state" {
                @for state in StateFilter::ALL {
                    option value=(state.name()) selected[state == filter.state] { (state.name()) }
                }
            }
            @if filter.per_page != view::DEFAULT_PER_PAGE { input type="hidden" name="per" value=(filter.per_page); }
            button type="submit" { "Filter" }
        }
    }
}

fn pager(filter: &Filter, page: usize, pages: usize) -> Markup {
    html! {
        @if pages > 1 {
            nav.pager aria-label="Pages" {
                @if page > 1 { a rel="prev" href={ "/?" (filter.query_for(page - 1)) } { "← Previous" } }
                span { "Page " (page) " of " (pages) }
                @if page < pages { a rel="next" href={ "/?" (filter.query_for(page + 1)) } { "Next →" } }
            }
        }
    }
}

fn strip_of(cells: &[Cell]) -> Markup {
    html! {
        @if cells.is_empty() { span.empty { "no ticks yet" } } @else {
            ol.ticks {
                @for cell in cells {
                    li class={ "tick t-" (cell.outcome.name()) } title=(cell.brief) { (cell.outcome.short()) }
                }
            }
        }
    }
}

fn state(status: &JobStatus) -> Markup {
    html! {
        @if !status.enabled { span.state.disabled { "disabled" } }
        @if let Some(paused) = &status.paused {
            span.state.paused { "paused" }
            " by " (paused.pause.by)
            @if let Some(until) = paused.pause.until { " until " (instant(until)) }
            @if !paused.pause.reason.is_empty() { ": " q { (paused.pause.reason) } }
        }
        @if !status.running.is_empty() { " " span.state.running { "running" } }
        @if status.overdue.is_some() { " " span.state.overdue { "overdue" } }
        @if status.unfinished { " " span.state.failed { "unfinished" } }
        @if status.enabled && status.paused.is_none() && status.running.is_empty() && status.overdue.is_none() { span.state { "active" } }
    }
}

fn job_state(job: &JobConfig, status: &JobStatus) -> Markup {
    let name = match (&status.paused, job.enabled) {
        (_, false) => "disabled",
        (Some(_), _) => "paused",
        (None, true) => "active",
    };
    html! { p #job-state data-state=(name) { (state(status)) } }
}

fn last_run(status: &JobStatus) -> Markup {
    html! {
        @match &status.last_run {
            None => span.empty { "never" },
            Some(run) => {
                @let outcome = view::Outcome::of_entry(run);
                time datetime=(instant_ms(run.tick)) { (instant_ms(run.tick)) }
                " " span class={ "outcome t-" (outcome.name()) } { (outcome.label()) }
                " on " (run.worker)
                @if let Some(token) = run.token { ", token " (token) }
                @if let Some(ms) = run.duration_ms { ", " (duration_ms(ms)) }
            }
        }
    }
}

/// A pause's or resume's row (a `control` entry of the history: not a tick, so apart from the ticks).
fn control_row(control: &Entry) -> Markup {
    let action = control.action.as_deref().unwrap_or("control");
    html! {
        tr data-action=(action) {
            th scope="row" { (instant_ms(control.tick)) }
            td { (action) }
            td { @if let Some(by) = &control.by { (by) } }
            td { @if let Some(reason) = &control.reason { (reason) } }
            td { @if let Some(until) = control.until { (instant(until)) } }
        }
    }
}

fn history_row(job: &JobConfig, record: &TickRecord) -> Markup {
    let entry = &record.record;
    let outcome = view::Outcome::of(record);
    let cell = Cell::of(record);
    let link = format!(
        "/jobs/{}?tick={}#explain",
        encode_path(&job.name),
        entry.tick
    );
    html! {
        tr data-tick=(entry.tick) data-outcome=(outcome.name()) {
            th scope="row" { a href=(link) { (instant_ms(entry.tick)) } }
            td { span class={ "outcome t-" (outcome.name()) } { (outcome.label()) }
                 @if let Some(reason) = &entry.reason { " (" (reason) ")" }
                 @if record.double_run() { " " strong.bad { "ran twice" } } }
            td { @if entry.kind == Kind::Run { (entry.worker) } }
            td.number { @if let Some(token) = entry.token { (token) } }
            td.number { @if let Some(attempt) = entry.attempt { (attempt) } }
            td { @if let Some(trigger) = &entry.trigger { code { (trigger.chars().take(8).collect::<String>()) } } }
            td.number { @if let Some(code) = entry.exit_code { (code) } @if let Some(signal) = entry.signal { "signal " (signal) } }
            td.number { @if let Some(ms) = entry.duration_ms { (duration_ms(ms)) } }
            td.number { @if let Some(ms) = cell.start_delay_ms { (duration_ms(ms)) } }
        }
    }
}

/// How many of a worker's runs under way `/workers` names; the rest are counted, and listed by
/// `/?state=running` (a busy worker runs thousands at once).
const RUNS_LISTED: usize = 10;

fn worker_row(worker: &WorkerStatus, max_offset_ms: i64) -> Markup {
    let member = &worker.member;
    let state = if member.state == "stopped" {
        "stopped"
    } else if member.alive {
        "alive"
    } else {
        "dead"
    };
    let far = member
        .clock_offset_ms
        .is_some_and(|ms| ms.abs() > max_offset_ms);
    html! {
        tr data-worker=(member.id) data-state=(state) {
            th scope="row" { (member.id) }
            td { span class={ "state " (state) } { (state) } }
            td { (member.host) }
            td.number { (member.pid) }
            td { (member.version) }
            td { (instant(member.started_at)) }
            td { @if let Some(seen) = member.seen_at { (instant(seen)) } }
            td.number { @match member.clock_offset_ms {
                Some(ms) => { (ms) " ms" @if far { " " strong.bad { "above max_clock_offset" } } },
                None => "not measured",
            } }
            td { code { (member.config_fingerprint) } @if worker.config_differs { " " strong.bad { "differs" } } }
            td {
                // A worker that is gone runs nothing: its last announcement's runs ended with it (the job's
                // page says whether their end was recorded).
                @if !member.alive && !member.running.is_empty() { "none (gone)" }
                @for run in member.running.iter().filter(|_| member.alive).take(RUNS_LISTED) {
                    a href={ "/jobs/" (encode_path(&run.job)) } { (run.job) } " (token " (run.token) ") "
                }
                @if member.alive && member.running.len() > RUNS_LISTED {
                    a href="/?state=running" { "and " (member.running.len() - RUNS_LISTED) " more" }
                }
            }
        }
        // Other processes under the same id: the store keeps one record per id, and the worker that
        // wrote it lists the others it found (`shared_with`).
        @for sharer in member.shared_with.iter().filter(|_| member.alive) {
            tr data-worker=(member.id) data-state="shared" {
                th scope="row" { (member.id) }
                td { span.state.dead { "shares this id" } }
                td { (sharer.host) }
                td.number { (sharer.pid) }
                td colspan="2" { strong.bad { "another process announces this worker's id" } ": give each worker its own worker.id" }
                td { (instant(sharer.seen_at)) }
                td colspan="3" {}
            }
        }
    }
}

/// The forms that pause or resume every job listed on this page of `/` (a maintenance window): they
/// name the jobs the operator sees, not the filter, which may select others by the time they post.
fn bulk_controls<S, C>(
    rows: &[(&JobStatus, S, C)],
    filter: &Filter,
    page: usize,
    csrf: Option<String>,
) -> Markup {
    let names: Vec<&str> = rows
        .iter()
        .map(|(status, _, _)| status.name.as_str())
        .collect();
    let jobs = names.join(" ");
    let count = names.len();
    let back = filter.query_for(page);
    let csrf = csrf.unwrap_or_default();
    let these = if count == 1 {
        "this job".to_string()
    } else {
        format!("these {count} jobs")
    };
    html! {
        section.controls #bulk aria-label="Controls of the jobs listed" {
            h2 { "Controls of the " (count) " job" @if count != 1 { "s" } " listed" }
            form #bulk-pause-form method="post" action="/api/jobs/pause" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="jobs" value=(jobs);
                input type="hidden" name="back" value=(back);
                label for="bulk-reason" { "Reason" }
                input #bulk-reason name="reason" required maxlength="500";
                label for="bulk-for" { "For (e.g. 2h; empty: until resumed)" }
                input #bulk-for name="for" maxlength="20";
                button type="submit" { "Pause " (these) }
            }
            form #bulk-resume-form method="post" action="/api/jobs/resume" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="jobs" value=(jobs);
                input type="hidden" name="back" value=(back);
                button type="submit" { "Resume " (these) }
            }
        }
    }
}

fn controls(job: &JobConfig, status: &JobStatus, csrf: Option<String>) -> Markup {
    let base = format!("/api/jobs/{}", encode_path(&job.name));
    let csrf = csrf.unwrap_or_default();
    html! {
        section.controls aria-label="Controls" {
            h2 { "Controls" }
            @if status.paused.is_some() {
                form #resume-form method="post" action={ (base) "/resume" } {
                    input type="hidden" name="csrf" value=(csrf);
                    button type="submit" { "Resume" }
                }
            } @else {
                form #pause-form method="post" action={ (base) "/pause" } {
                    input type="hidden" name="csrf" value=(csrf);
                    label for="reason" { "Reason" }
                    input #reason name="reason" required maxlength="500";
                    label for="for" { "For (e.g. 30m; empty: until resumed)" }
                    input #for name="for" maxlength="20";
                    button type="submit" { "Pause" }
                }
            }
            @if job.enabled {
                form #trigger-form method="post" action={ (base) "/trigger" } {
                    input type="hidden" name="csrf" value=(csrf);
                    button type="submit" { "Run now" }
                }
            }
        }
    }
}

/// The state of trigger request `id` as the job's history tells it, and a sentence.
fn trigger_state(id: &str, ticks: &[TickRecord], status: &JobStatus) -> (&'static str, String) {
    let record = ticks
        .iter()
        .find(|r| r.record.trigger.as_deref() == Some(id));
    match record.map(|r| &r.record) {
        Some(run) if run.kind == Kind::Run && run.ended_at.is_some() => (
            "ended",
            format!(
                "Ran on {} with token {}: {}{}.",
                run.worker,
                run.token.unwrap_or_default(),
                run.outcome.as_deref().unwrap_or("ended"),
                run.duration_ms
                    .map(|ms| format!(" after {}", duration_ms(ms)))
                    .unwrap_or_default()
            ),
        ),
        Some(run) if run.kind == Kind::Run => (
            "started",
            format!(
                "Running on {} with token {}.",
                run.worker,
                run.token.unwrap_or_default()
            ),
        ),
        Some(other) => (
            "not_run",
            format!(
                "Not run: {}.",
                other.reason.as_deref().unwrap_or(other.kind.as_str())
            ),
        ),
        None if status.pending_triggers.iter().any(|t| t.id == id) => (
            "waiting",
            "Waiting for a worker to claim the request.".to_string(),
        ),
        None => (
            "waiting",
            "Waiting for the request to be claimed and recorded.".to_string(),
        ),
    }
}

/// The job's command as shown: as the file writes it, so that no `${VAR}`'s value is shown.
fn command(job: &JobConfig) -> String {
    if let Some(written) = &job.command_as_written {
        return written.clone();
    }
    match &job.command {
        Command::Shell(script) => script.clone(),
        Command::Argv(argv) => argv.join(" "),
    }
}

/// A store node's Sentinel cells: the group's master as this worker uses it and the failovers it saw
/// (the last one's time on hover); empty cells for a plain server beside groups.
fn group_cells(group: Option<&crate::store::GroupState>) -> Markup {
    html! {
        @match group {
            Some(group) => {
                td data-master=[group.master.as_deref()] {
                    @match &group.master { Some(master) => code { (master) }, None => span.empty { "not reached yet" } }
                }
                td title=[group.last_failover.map(|at| format!("the last at {}", instant(at)))] { (group.failovers) }
            }
            None => { td { span.empty { "-" } } td { span.empty { "-" } } }
        }
    }
}

fn when(at: Option<DateTime<Utc>>) -> Markup {
    html! { @match at { Some(at) => time datetime=(instant(at)) { (instant(at)) }, None => span.empty { "none" } } }
}

fn instant(at: DateTime<Utc>) -> String {
    crate::inspect::time::instant(at)
}

/// `text` percent-encoded for a URL's query (everything but RFC 3986's unreserved characters).
pub(crate) fn encode_query(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// `text` percent-encoded as one path segment.
pub(crate) fn encode_path(text: &str) -> String {
    encode_query(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_never_sends_anyone_elsewhere() {
        for (next, expected) in [
            ("/jobs/a?tick=1", "/jobs/a?tick=1"),
            ("//evil.example/", "/"),
            ("https://evil.example/", "/"),
            ("/\\evil", "/"),
            ("", "/"),
        ] {
            assert_eq!(safe_next(next), expected, "{next:?}");
        }
    }

    /// The Workers page's row of a worker `id`, `alive` or not, announcing `running`.
    fn row_of(id: &str, alive: bool, running: serde_json::Value) -> String {
        row_sharing(id, alive, running, serde_json::json!([]))
    }

    /// [`row_of`] for a worker that lists `shared_with`.
    fn row_sharing(
        id: &str,
        alive: bool,
        running: serde_json::Value,
        shared_with: serde_json::Value,
    ) -> String {
        let member: crate::membership::Member = serde_json::from_value(serde_json::json!({
            "id": id, "started_at": "2026-11-27T00:00:00Z", "alive": alive, "running": running,
            "shared_with": shared_with,
        }))
        .expect("a member");
        let worker = WorkerStatus {
            member,
            config_differs: false,
            runs_this_config: true,
        };
        worker_row(&worker, 500).into_string()
    }

    #[test]
    fn a_busy_worker_s_runs_are_named_up_to_a_bound_and_the_rest_counted() {
        let running: Vec<serde_json::Value> = (0..25)
            .map(|i| serde_json::json!({"job": format!("job {i}"), "tick": 1_000, "token": 7}))
            .collect();
        let row = row_of("w1", true, serde_json::json!(running));
        assert_eq!(
            row.matches("<a href=\"/jobs/job%20").count(),
            RUNS_LISTED,
            "{row}"
        );
        assert!(
            row.contains(">job 9</a>") && !row.contains("job 10<"),
            "{row}"
        );
        assert!(
            row.contains("<a href=\"/?state=running\">and 15 more</a>"),
            "{row}"
        );
    }

    /// Two processes under one id are two rows: the record's, and one per other process it lists.
    #[test]
    fn each_process_that_shares_an_id_has_a_row() {
        let others =
            serde_json::json!([{"host": "web-2", "pid": 4242, "seen_at": "2026-11-27T00:00:01Z"}]);
        let row = row_sharing("web-1", true, serde_json::json!([]), others.clone());
        assert_eq!(row.matches("<tr data-worker=\"web-1\"").count(), 2, "{row}");
        assert!(row.contains("data-state=\"shared\""), "{row}");
        assert!(
            row.contains("<td>web-2</td>") && row.contains(">4242<"),
            "{row}"
        );
        // A record of a worker that is gone says nothing of who is alive now.
        let gone = row_sharing("web-1", false, serde_json::json!([]), others);
        assert!(!gone.contains("data-state=\"shared\""), "{gone}");
    }

    /// A worker that is gone runs nothing: its row lists none of its last announcement's runs.
    #[test]
    fn a_gone_worker_s_row_lists_no_run() {
        let running = serde_json::json!([{"job": "slow", "tick": 1_000, "token": 7}]);
        let row = row_of("w3", false, running);
        assert!(!row.contains("/jobs/slow"), "{row}");
        assert!(row.contains("none (gone)"), "{row}");
    }

    #[tokio::test]
    async fn answers_are_gzipped_for_a_client_that_takes_it() {
        use std::io::Read as _;
        let text = "{\"job\":\"backup\"}".repeat(1000);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            header::HeaderValue::from_static("br, gzip"),
        );
        let response = compressed_as(&headers, text.clone(), "application/json");
        assert_eq!(response.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("the body");
        assert!(body.len() < text.len() / 10, "{} bytes", body.len());
        let mut plain = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut plain)
            .expect("gzip");
        assert_eq!(plain, text);
        let plain = compressed_as(&HeaderMap::new(), text, "application/json");
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
    }

    #[test]
    fn names_are_encoded_for_urls() {
        assert_eq!(encode_path("a b/<c>"), "a%20b%2F%3Cc%3E");
        assert_eq!(encode_query("ok-1_2.3~"), "ok-1_2.3~");
    }
}
