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
//! - [`auth`]: tokens, session cookies, CSRF; `attempts`: one wrong token per client a second.
//! - `hosts`: the names the dashboard answers to (`Host`, `Origin`), against DNS rebinding.
//! - `read`: what each page reads from the store, bounded in time.
//! - `view`: the pure part: rows, tick strips, filters, paging.
//! - `pages`: the HTML; `words` (a schedule in words) and `chart` (a job's timeline in SVG) beside it.
//! - `api`: the JSON routes and the controls.
//! - `bulk`: pause and resume of several jobs at once (a maintenance window), and `/`'s form for it.

mod api;
mod attempts;
pub(crate) mod auth;
mod bulk;
mod chart;
mod hosts;
mod pages;
mod read;
mod revoked;
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
use crate::clock::cluster::ClusterClock;
use crate::config::{Config, DashboardToken, Serving};
use crate::store::Store;

/// The Content-Security-Policy of every answer: scripts and styles from this origin's `/assets` only, no
/// inline script or style, no framing, forms posted here only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the dashboard reads of the worker that serves it: its store, its cluster time and the config in
/// force. The worker's state implements it; the dashboard sees no more of it.
pub(crate) trait Host: Send + Sync + 'static {
    /// The store the worker claims on.
    fn store(&self) -> &Store;
    /// Cluster time, on which the worker schedules.
    fn clock(&self) -> &ClusterClock;
    /// The config in force (a reload replaces it).
    fn config(&self) -> Arc<Config>;
}

/// What the dashboard's handlers share.
pub(crate) struct Dashboard {
    context: Arc<dyn Host>,
    /// The listener's address: whether it is loopback decides who may read without a token.
    listen: SocketAddr,
    /// The keys of the tokens in force, rebuilt when a reload changes them.
    keys: Mutex<(Vec<DashboardToken>, Arc<Keys>)>,
    /// The last failed token of each client address ([`attempts`]).
    attempts: attempts::Attempts,
    /// The turns of the reads of every job's history.
    scans: read::Scans,
    /// The turns of every page's and `/api` answer's read ([`read::Reads`]).
    reads: read::Reads,
    /// This host's names ([`hosts`]).
    hosts: hosts::Hosts,
    /// The sessions ended by a logout here ([`revoked`]).
    revoked: revoked::Revoked,
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
    pub(crate) fn new(context: Arc<dyn Host>, listen: SocketAddr) -> Arc<Dashboard> {
        let tokens = context.config().dashboard.tokens.clone();
        let keys = Arc::new(Keys::new(&tokens));
        Arc::new(Dashboard {
            context,
            listen,
            keys: Mutex::new((tokens, keys)),
            attempts: attempts::Attempts::new(),
            scans: read::Scans::new(),
            reads: read::Reads::new(),
            hosts: hosts::Hosts::of_this_host(),
            revoked: revoked::Revoked::new(),
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

    /// Checks a token offered by `from` with `check`, unless `from` failed within
    /// [`attempts::COOLDOWN`]; a failure is logged and answered after [`auth::FAILED_ATTEMPT_DELAY`].
    async fn attempt<T>(
        &self,
        from: Option<SocketAddr>,
        check: impl FnOnce() -> Result<T, ()>,
    ) -> attempts::Attempt<T> {
        let ip = from.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
        let attempt = self.attempts.attempt(ip, check);
        if let attempts::Attempt::Failed = attempt {
            tracing::warn!(event = crate::logging::events::dashboard::LOGIN_FAILED, from = %ip,
                           "A wrong dashboard token was offered");
            tokio::time::sleep(auth::FAILED_ATTEMPT_DELAY).await;
        }
        attempt
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
        .layer(middleware::from_fn_with_state(
            Arc::clone(&dashboard),
            known_host,
        ))
        .layer(middleware::map_response(secure))
        .with_state(dashboard)
}

/// Lets a request through if its `Host` is one of the dashboard's names ([`hosts`]); else 421.
async fn known_host(
    State(dashboard): State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(host) = request.headers().get(header::HOST) else {
        return next.run(request).await;
    };
    let config = dashboard.context.config();
    let allowed = &config.dashboard.allowed_hosts;
    let host = String::from_utf8_lossy(host.as_bytes());
    if dashboard.hosts.allows(&host, allowed) {
        return next.run(request).await;
    }
    let shown: String = host.chars().take(100).collect();
    let text = format!(
        "Misdirected request: Host {shown:?} is not a name of this dashboard ({}). A page of another \
         site reaching it through DNS rebinding would look like this; if you reach the dashboard by \
         this name, add it to dashboard.allowed_hosts.\n",
        dashboard.hosts.describe(allowed)
    );
    (StatusCode::MISDIRECTED_REQUEST, text).into_response()
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
        let now = chrono::Utc::now().timestamp();
        let headers = request.headers();
        // Only a bearer header is a guess; a cookie is checked by its mac, which no one guesses.
        let proved = if headers.contains_key(header::AUTHORIZATION) {
            let from = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0);
            dashboard
                .attempt(from, || keys.operator(headers, now))
                .await
        } else {
            attempts::Attempt::Passed(keys.operator(headers, now).unwrap_or(None))
        };
        // A session ended by a logout ([`revoked`]) is no proof, as an expired one is not.
        let ended = |operator: &Operator| {
            let session = operator.session.as_deref();
            session.is_some_and(|cookie| dashboard.revoked.is_revoked(cookie))
        };
        match proved {
            attempts::Attempt::Passed(Some(operator)) if !ended(&operator) => Some(operator),
            attempts::Attempt::Passed(_) if api => {
                return unauthorized("a dashboard token is needed")
            }
            attempts::Attempt::Passed(_) => {
                let back = request.uri().path_and_query().map_or("/", |p| p.as_str());
                return Redirect::to(&format!("/login?next={}", pages::encode_query(back)))
                    .into_response();
            }
            attempts::Attempt::Failed => {
                return unauthorized("the bearer token is not one of dashboard.tokens")
            }
            attempts::Attempt::Cooling => return cooling(),
        }
    } else {
        None
    };
    request.extensions_mut().insert(Access {
        config,
        operator,
        keys,
    });
    // Every GET behind the gate reads the store: it takes its turn ([`read::Reads`]).
    if request.method() != Method::GET {
        return next.run(request).await;
    }
    let Some(turn) = dashboard.reads.turn().await else {
        let wait = read::READ_WAIT.as_secs();
        let text = format!(
            "Busy: the dashboard's reads of the store are all taken, and none freed within {wait} s; \
             try again.\n"
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            text,
        )
            .into_response();
    };
    read::holding(turn, next.run(request).await)
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
        let allowed = &config.dashboard.allowed_hosts;
        let allows = |authority: &str| dashboard.hosts.allows(authority, allowed);
        if let Some(why) = auth::cross_site(headers, &allows) {
            return Some((StatusCode::FORBIDDEN, format!("Refused: {why}.\n")).into_response());
        }
    }
    None
}

/// The answer to a token offered within [`attempts::COOLDOWN`] of its client's last failure: 429, not
/// checked.
fn cooling() -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, "1")],
        "Too many requests: a wrong token came from this address less than a second ago; try again.\n",
    )
        .into_response()
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
