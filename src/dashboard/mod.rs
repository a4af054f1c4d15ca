//! The web dashboard: the cluster's state at a glance, served by every worker on `worker.listen` beside
//! `/metrics`, and — when `dashboard.controls` allows — pause, resume and trigger through the lock.
//!
//! Any worker shows the whole cluster: every page reads the store through the same [`crate::inspect`]
//! model as `redcron status`, `history` and `explain`, and the JSON API (`/api/status`, `/api/history`,
//! `/api/explain`) answers in the command line's `--json` shapes. Pages are HTML rendered on the server
//! (maud templates compiled into the binary) and work with JavaScript off; a few KB of embedded script
//! only keeps them live (it polls the page with `If-None-Match`, slower while nothing changes, not at
//! all while the tab is hidden).
//!
//! # Who sees what ([`auth`], [`crate::config::DashboardConfig`])
//! Without a token the dashboard is read-only and served only on a loopback address (or `public: true`);
//! with one, every page and `/api/*` route needs it (bearer header or the login's session cookie), and
//! the controls may be switched on. GET never changes anything. Every answer carries a
//! Content-Security-Policy without inline script or style, forbids framing, and is not cached; every
//! value from the config, the history or the store is escaped by the templates. `/metrics`, `/healthz`
//! and `/readyz` are the listener's own and never need a token.
//!
//! # Layout
//! - [`auth`]: tokens, session cookies, CSRF.
//! - `read`: what each page reads from the store, bounded in time.
//! - `view`: the pure part: rows, tick strips, filters, paging.
//! - `pages`: the HTML; `words` (a schedule in words) and `chart` (a job's timeline in SVG) beside it.
//! - `api`: the JSON routes and the controls.
//! - `bulk`: pause and resume of several jobs at once (a maintenance window), and `/`'s form for it.

mod api;
pub(crate) mod auth;
mod bulk;
mod chart;
mod pages;
mod read;
mod view;
mod words;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

use self::auth::{Keys, Operator};
use crate::config::{Config, DashboardToken, Serving};
use crate::worker::Context;

/// The Content-Security-Policy of every answer: scripts and styles from this origin's `/assets` only, no
/// inline script or style, no framing, forms posted here only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the dashboard's handlers share.
pub(crate) struct Dashboard {
    context: Arc<Context>,
    /// The listener's address: whether it is loopback decides who may read without a token.
    listen: SocketAddr,
    /// The keys of the tokens in force, rebuilt when a reload changes them.
    keys: Mutex<(Vec<DashboardToken>, Arc<Keys>)>,
    /// Held by a failed attempt while it waits: one failure is answered at a time.
    failures: tokio::sync::Mutex<()>,
    /// The turns of the reads of every job's history.
    scans: read::Scans,
}

/// What the gate found out about a request that may go on.
#[derive(Clone)]
pub(crate) struct Access {
    /// The config in force when the request came.
    pub config: Arc<Config>,
    /// Who made it, when a token is configured.
    pub operator: Option<Operator>,
    /// The keys of the config's tokens, for CSRF tokens.
    pub keys: Arc<Keys>,
}

impl Access {
    /// The token's name of the operator who made the request (empty without a token).
    pub(crate) fn operator_name(&self) -> &str {
        self.operator.as_ref().map_or("", |o| o.name.as_str())
    }

    /// Whether this request may use the controls: they are on, and it proved a token.
    pub(crate) fn may_control(&self) -> bool {
        self.config.dashboard.controls && self.operator.is_some()
    }

    /// The CSRF token for the forms of this request's session (none for a bearer request).
    pub(crate) fn csrf(&self) -> Option<String> {
        let operator = self.operator.as_ref()?;
        let session = operator.session.as_deref()?;
        self.keys.csrf(&operator.name, session)
    }
}

impl Dashboard {
    /// The dashboard of the worker whose state is `context`, served on `listen`.
    pub(crate) fn new(context: Arc<Context>, listen: SocketAddr) -> Arc<Dashboard> {
        let tokens = context.config().dashboard.tokens.clone();
        let keys = Arc::new(Keys::new(&tokens));
        Arc::new(Dashboard {
            context,
            listen,
            keys: Mutex::new((tokens, keys)),
            failures: tokio::sync::Mutex::new(()),
            scans: read::Scans::new(),
        })
    }

    /// The keys of `config`'s tokens.
    fn keys(&self, config: &Config) -> Arc<Keys> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.0 != config.dashboard.tokens {
            *keys = (
                config.dashboard.tokens.clone(),
                Arc::new(Keys::new(&config.dashboard.tokens)),
            );
        }
        Arc::clone(&keys.1)
    }

    /// Answers a failed attempt from `from` after [`auth::FAILED_ATTEMPT_DELAY`], one at a time.
    async fn failed_attempt(&self, from: Option<SocketAddr>) {
        let from = from.map_or_else(|| "unknown".to_string(), |a| a.ip().to_string());
        tracing::warn!(event = crate::logging::events::dashboard::LOGIN_FAILED, from = %from,
                       "A wrong dashboard token was offered");
        let _one_at_a_time = self.failures.lock().await;
        tokio::time::sleep(auth::FAILED_ATTEMPT_DELAY).await;
    }
}

/// The dashboard's routes, to merge into the listener's router.
pub(crate) fn router(dashboard: Arc<Dashboard>) -> Router {
    let gated = Router::new()
        .route("/", get(pages::index))
        .route("/jobs/{name}", get(pages::job))
        .route("/workers", get(pages::workers))
        .route("/api/status", get(api::status))
        .route("/api/history", get(api::history))
        .route("/api/explain", get(api::explain))
        .route("/api/jobs/{action}", post(bulk::control))
        .route("/api/jobs/{name}/{action}", post(api::control))
        .route("/logout", post(pages::logout))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&dashboard), gate));
    Router::new()
        .merge(gated)
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/assets/app.js", get(pages::script))
        .route("/assets/style.css", get(pages::style))
        .layer(middleware::map_response(secure))
        .with_state(dashboard)
}

/// Lets a request through, with its [`Access`], or answers it: not served (404), cross-site (403), no or
/// a wrong token (a page goes to `/login`; `/api` answers 401).
async fn gate(
    State(dashboard): State<Arc<Dashboard>>,
    mut request: Request,
    next: Next,
) -> Response {
    let config = dashboard.context.config();
    if let Some(refused) = refuse(&dashboard, &config, request.method(), request.headers()) {
        return refused;
    }
    let keys = dashboard.keys(&config);
    let api = request.uri().path().starts_with("/api/");
    let operator = if keys.any() {
        match keys.operator(request.headers(), chrono::Utc::now().timestamp()) {
            Ok(Some(operator)) => Some(operator),
            Ok(None) if api => return unauthorized("a dashboard token is needed"),
            Ok(None) => {
                let back = request.uri().path_and_query().map_or("/", |p| p.as_str());
                return Redirect::to(&format!("/login?next={}", pages::encode_query(back)))
                    .into_response();
            }
            Err(()) => {
                let from = request
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map(|c| c.0);
                dashboard.failed_attempt(from).await;
                return unauthorized("the bearer token is not one of dashboard.tokens");
            }
        }
    } else {
        None
    };
    request.extensions_mut().insert(Access {
        config,
        operator,
        keys,
    });
    next.run(request).await
}

/// The answer to a request the dashboard does not serve at all: off (404), or a state-changing request
/// from another site (403).
fn refuse(
    dashboard: &Dashboard,
    config: &Config,
    method: &Method,
    headers: &HeaderMap,
) -> Option<Response> {
    if let Serving::Off(why) = config.dashboard.serving(Some(dashboard.listen)) {
        let text = format!("The dashboard is not served: {why}.\n");
        return Some((StatusCode::NOT_FOUND, text).into_response());
    }
    if method != Method::GET && method != Method::HEAD {
        if let Some(why) = auth::cross_site(headers) {
            return Some((StatusCode::FORBIDDEN, format!("Refused: {why}.\n")).into_response());
        }
    }
    None
}

fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"redcron\"")],
        format!("Unauthorized: {why}.\n"),
    )
        .into_response()
}

/// The headers every dashboard answer carries.
async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name: &'static str, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(headers, "content-security-policy", CSP);
    set(headers, "x-frame-options", "DENY");
    set(headers, "x-content-type-options", "nosniff");
    // Not `no-referrer`: under it a browser sends `Origin: null` with every form post, its own pages'
    // included, and the cross-site check refuses them all (login, pause, resume, trigger). `same-origin`
    // still tells other sites nothing.
    set(headers, "referrer-policy", "same-origin");
    set(headers, "cross-origin-opener-policy", "same-origin");
    if !headers.contains_key(header::CACHE_CONTROL) {
        set(headers, "cache-control", "no-store");
    }
    response
}
