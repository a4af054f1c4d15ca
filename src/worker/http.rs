//! The worker's HTTP listener (`worker.listen`, off by default): `/metrics`, `/healthz`, `/readyz`, and the
//! web dashboard ([`crate::dashboard`], its own routes and rules).
//!
//! Served by axum on hyper — the tokio project's HTTP stack, so no HTTP is parsed here — in the worker's
//! own runtime. The address is bound before the worker starts, so a port in use stops it at once with an
//! error naming the address. The listener answers until the worker has stopped: while running jobs drain
//! after a shutdown request, `/metrics` still shows them end and `/readyz` says the worker is shutting
//! down. What is ready is decided by [`verdict`], which is pure, so its rules are tested without nodes:
//! - `/healthz`: 200 while the process runs (its runtime answers).
//! - `/readyz`: 200 when the store answers now as a claim needs it to — by its own rule
//!   ([`crate::store::Health::readiness`]): on Redis a majority of the nodes answers `TIME` (one read, as
//!   the clock check makes) and this host's offset to their clocks is within `worker.max_clock_offset`;
//!   on etcd a linearizable read answers (only a majority of members can serve it); the embedded store's
//!   file gives its write lock — and no shutdown was requested (the config is loaded, as the worker
//!   runs). Otherwise 503, with the reason in one line. The store's answer is awaited at most
//!   [`READY_TIMEOUT`].
//! - `/metrics`: [`crate::metrics::Metrics::encode`].
//!
//! The listener shares the process's descriptors with the jobs' children, and anyone who reaches the port
//! can open connections and send nothing. So it serves at most [`Limits::connections`] connections at
//! once (derived from the open-file limit beside the children's slots: [`super::slots`]); a connection
//! past them is accepted and closed at once, and counted (`redcron_http_connections_refused_total`),
//! so that neither the descriptors nor the kernel's backlog fill. Each connection serves one request
//! (no keep-alive), whose headers must arrive within [`HEADER_TIMEOUT`], whose body within
//! [`BODY_TIMEOUT`] after them (else 408), and which must be answered within [`REQUEST_TIMEOUT`] in
//! all, or the connection is closed: a slow or silent client holds a descriptor for a bounded time.
//! A share of the connections is kept for the probes ([`budget`]): a liveness probe that fails under
//! dashboard load would restart a healthy worker and end its jobs. HTTP is still parsed by hyper (axum's
//! own stack), which axum's `serve` wraps without these bounds.

mod budget;

use std::any::Any;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::FutureExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::budget::{Admitted, Budget, Held};
use super::{Context, WorkerError};
use crate::clock::cluster::{estimate, Estimate, Readings, TooFewSamples};
use crate::config::{show_duration, Serving, WorkerConfig};
use crate::logging::events;
use crate::metrics::Metrics;

/// The longest a `/readyz` waits for the store (each node or request is bounded by `lock.node_timeout`
/// already; the embedded store waits for another process's write lock up to 2 s).
const READY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long requests under way may take to finish once the worker has stopped.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// How long a connection may take to send its request's headers.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may take from its accept to the last byte of its answer (`/readyz` waits
/// [`READY_TIMEOUT`] at most; Prometheus gives up on a scrape after 10 s by default).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body may take to arrive once its headers have: a login form or a control's
/// JSON is a few hundred bytes, sent with the headers.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a connection's request may buffer (its headers): a GET needs a few hundred bytes.
const MAX_BUFFER: usize = 64 * 1024;
/// The largest request body read (a control of several jobs names them all).
const MAX_BODY: usize = 2 * 1024 * 1024;
/// How long the listener waits before accepting again after an error that is not the connection's
/// (the process is out of descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What the listener allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections served at once ([`super::slots::listener_connections`]); more are closed unanswered.
    pub(crate) connections: usize,
    /// See [`HEADER_TIMEOUT`].
    pub(crate) header_timeout: Duration,
    /// See [`REQUEST_TIMEOUT`].
    pub(crate) request_timeout: Duration,
}

/// Binds `address`, if any; a failure (the port is taken, the address is not this host's) names it.
pub(super) async fn bind(address: Option<SocketAddr>) -> Result<Option<TcpListener>, WorkerError> {
    let Some(address) = address else {
        return Ok(None);
    };
    match TcpListener::bind(address).await {
        Ok(listener) => Ok(Some(listener)),
        Err(source) => Err(WorkerError::Listen { address, source }),
    }
}

/// The listener's task, if `worker.listen` is set.
pub(super) struct Server {
    serving: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

/// What the handlers read.
struct Probe {
    context: Arc<Context>,
    max_clock_offset: Duration,
}

impl Server {
    /// Serves on `listener` (bound by [`bind`]) within `limits` until [`Server::stop`].
    pub(super) fn start(
        listener: Option<TcpListener>,
        context: &Arc<Context>,
        worker: &WorkerConfig,
        limits: Limits,
    ) -> Server {
        let Some(listener) = listener else {
            return Server { serving: None };
        };
        let address = listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string());
        let config = context.config();
        let serving = config.dashboard.serving(listener.local_addr().ok());
        let dashboard = match &serving {
            Serving::Off(_) => "off",
            Serving::Open => "read-only, no token",
            Serving::Token if config.dashboard.controls => "token, controls on",
            Serving::Token => "token, read-only",
        };
        let serves = match serving {
            Serving::Off(why) => {
                format!("/metrics, /healthz and /readyz; the dashboard is off: {why}")
            }
            Serving::Open | Serving::Token => {
                "/metrics, /healthz, /readyz and the dashboard".into()
            }
        };
        info!(event = events::worker::LISTENING, address = %address,
              max_connections = limits.connections as u64, dashboard,
              "Serving {serves}");
        let probe = Arc::new(Probe {
            context: Arc::clone(context),
            max_clock_offset: worker.max_clock_offset,
        });
        let dashboard = listener.local_addr().map(|listen| {
            let host: Arc<dyn crate::dashboard::Host> = Arc::clone(context) as _;
            crate::dashboard::router(crate::dashboard::Dashboard::new(host, listen))
        });
        let probes = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(probe);
        let router = match dashboard {
            Ok(dashboard) => probes.clone().merge(dashboard),
            Err(_) => probes.clone(),
        };
        let routers = Routers {
            all: router.layer(middleware::from_fn(whole_body)),
            probes: probes.fallback(busy),
        };
        let stop = CancellationToken::new();
        let serving = serve(listener, routers, limits, Arc::clone(context), stop.clone());
        let task = tokio::spawn(async move {
            // `serve` has no error to return (it retries a failed accept); a panic in it is said here,
            // rather than lost with the task.
            if let Err(panic) = AssertUnwindSafe(serving).catch_unwind().await {
                let error = panic_message(panic.as_ref());
                warn!(event = events::worker::LISTENER_FAILED, address = %address, error = %error,
                      "The metrics and health listener stopped; the worker goes on without it");
            }
        });
        Server {
            serving: Some((stop, task)),
        }
    }

    /// Stops listening; requests under way get [`STOP_GRACE`] to finish.
    pub(super) async fn stop(self) {
        let Some((stop, mut task)) = self.serving else {
            return;
        };
        stop.cancel();
        if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// The listener's routes: all of them for a general connection, the probes' for a reserve one.
struct Routers {
    all: Router,
    probes: Router,
}

/// Accepts connections until `stop`, serving each in a task of its own while the [`Budget`] of
/// `limits.connections` lets it in, and closing it unanswered otherwise; then waits for the connections
/// under way (dropping this future aborts them).
async fn serve(
    listener: TcpListener,
    routers: Routers,
    limits: Limits,
    context: Arc<Context>,
    stop: CancellationToken,
) {
    let budget = Budget::new(limits.connections);
    let mut connections = JoinSet::new();
    let mut failing = false;
    loop {
        // Reap the connections that ended, so that the set holds only those under way.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                failing = false;
                let (router, limits, held) = match budget.admit(peer.ip()) {
                    Some(Admitted::General(held)) => (routers.all.clone(), limits, held),
                    Some(Admitted::Reserve(held)) => {
                        let limits = Limits {
                            header_timeout: budget::RESERVE_HEADER_TIMEOUT,
                            request_timeout: budget::RESERVE_REQUEST_TIMEOUT,
                            ..limits
                        };
                        (routers.probes.clone(), limits, held)
                    }
                    None => {
                        // Closed at once: the descriptor is given back, and the client told.
                        drop(stream);
                        context.metrics.connection_refused();
                        continue;
                    }
                };
                connections.spawn(connection(
                    stream,
                    router.layer(Extension(ConnectInfo(peer))),
                    limits,
                    held,
                    stop.clone(),
                ));
            }
            // The client gave up before the accept: nothing to do.
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) => {}
            Err(error) => {
                if !failing {
                    warn!(event = events::worker::LISTENER_ACCEPT_FAILED, error = %error,
                          "The metrics and health listener cannot accept connections (out of descriptors?); it tries again every 100ms");
                    failing = true;
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_RETRY) => {}
                }
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Serves one request on `stream` within `limits`, holding `_held` (its share of the [`Budget`]) until
/// the connection is closed. After `stop`, a request under way is answered and the connection closed.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    _held: Held,
    stop: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(false)
        .max_buf_size(MAX_BUFFER);
    let served = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    let mut served = std::pin::pin!(served);
    let whole = async {
        tokio::select! {
            _ = served.as_mut() => return,
            () = stop.cancelled() => {}
        }
        served.as_mut().graceful_shutdown();
        let _ = served.as_mut().await;
    };
    // Past the deadline the connection is dropped, and with it the socket: closed, whatever the client
    // sent or did not read.
    let _ = tokio::time::timeout(limits.request_timeout, whole).await;
}

/// What a panic said, if it said it in text.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// Reads the request's whole body within [`BODY_TIMEOUT`] (408 past it) and at most [`MAX_BODY`] bytes
/// (413), before any handler sees it: a client that sends its headers and then its body a byte at a time
/// holds its connection seconds, not the whole [`REQUEST_TIMEOUT`].
async fn whole_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(_)) => {
            let why = format!(
                "The request's body is over {} KiB, or was cut off.\n",
                MAX_BODY / 1024
            );
            (StatusCode::PAYLOAD_TOO_LARGE, why).into_response()
        }
        Err(_) => {
            let waited = show_duration(BODY_TIMEOUT);
            let why =
                format!("The request's body did not arrive within {waited} of its headers.\n");
            (StatusCode::REQUEST_TIMEOUT, why).into_response()
        }
    }
}

/// The answer on a reserve connection ([`budget`]) to anything but the probes: 503, try again.
async fn busy() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        "The listener is at its connection limit: only /healthz, /readyz and /metrics are answered now; try again.\n",
    )
        .into_response()
}

async fn metrics(State(probe): State<Arc<Probe>>) -> impl IntoResponse {
    let metrics = &probe.context.metrics;
    metrics.store_groups(&probe.context.store.groups());
    let text = metrics.encode();
    ([(header::CONTENT_TYPE, Metrics::CONTENT_TYPE)], text)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(probe): State<Arc<Probe>>) -> (StatusCode, String) {
    let context = &probe.context;
    let answer = if context.shutdown.is_requested() {
        Ok(None)
    } else {
        tokio::time::timeout(READY_TIMEOUT, context.store.readiness())
            .await
            .unwrap_or_else(|_| {
                let waited = show_duration(READY_TIMEOUT);
                Err(format!("the store did not answer within {waited}"))
            })
    };
    let shutting_down = context.shutdown.is_requested();
    let groups = group_lines(&context.store.groups());
    match verdict(shutting_down, answer, probe.max_clock_offset) {
        Ok(()) => (StatusCode::OK, format!("ready\n{groups}")),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{reason}\n{groups}"),
        ),
    }
}

/// One line per Sentinel group of the store, under `/readyz`'s verdict: the master this worker uses and
/// the failovers it has seen (nothing on other stores).
fn group_lines(groups: &[crate::store::GroupState]) -> String {
    groups
        .iter()
        .map(|group| {
            let master = group.master.as_deref().unwrap_or("not reached yet");
            let last = group.last_failover.map_or(String::new(), |at| {
                format!(", the last at {}", crate::inspect::time::instant(at))
            });
            format!(
                "group {}: master {master}, {} failover{} seen{last}\n",
                group.group,
                group.failovers,
                if group.failovers == 1 { "" } else { "s" }
            )
        })
        .collect()
}

/// Whether the worker is ready, or why not (one line), from the store's answer to its readiness check
/// ([`crate::store::Health::readiness`]): the nodes' clocks where it has them (a majority must have
/// answered, within `max_clock_offset` of this host), `None` when it answered without clocks, or why it
/// did not answer.
fn verdict(
    shutting_down: bool,
    answer: Result<Option<Readings>, String>,
    max_clock_offset: Duration,
) -> Result<(), String> {
    if shutting_down {
        return Err("shutting down: no new ticks are taken".to_string());
    }
    let readings = match answer {
        Ok(None) => return Ok(()),
        Ok(Some(readings)) => readings,
        Err(why) => return Err(why.replace(['\r', '\n'], " ")),
    };
    let Estimate { offset_us, .. } = estimate(
        &readings.samples,
        readings.configured,
        crate::lock::quorum::quorum(readings.configured),
    )
    .map_err(|too_few| no_majority(too_few, &readings))?;
    let offset = Duration::from_micros(offset_us.unsigned_abs());
    if offset > max_clock_offset {
        return Err(format!(
            "clock offset {}{} to the store's nodes is above worker.max_clock_offset ({})",
            if offset_us < 0 { "-" } else { "" },
            show_duration(offset),
            show_duration(max_clock_offset)
        ));
    }
    Ok(())
}

fn no_majority(too_few: TooFewSamples, readings: &Readings) -> String {
    let failures: Vec<String> = readings
        .failures
        .iter()
        .map(|(node, why)| format!("{node}: {}", why.replace(['\r', '\n'], " ")))
        .collect();
    format!(
        "no majority of the store's nodes answers: {too_few} ({})",
        failures.join("; ")
    )
}

/// The dashboard reads the worker's store, cluster time and config in force.
impl crate::dashboard::Host for Context {
    fn store(&self) -> &crate::store::Store {
        &self.store
    }
    fn clock(&self) -> &crate::clock::cluster::ClusterClock {
        &self.clock
    }
    fn config(&self) -> Arc<crate::config::Config> {
        Context::config(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::cluster::{wall_now_us, Sample};

    /// Readings in which the nodes `answering` (of 3) are `offset_ms` ahead of this host.
    fn readings(answering: &[usize], offset_ms: i64) -> Result<Option<Readings>, String> {
        let samples = answering
            .iter()
            .map(|&node| Sample {
                node,
                sent_us: wall_now_us(),
                rtt: Duration::ZERO,
                node_us: wall_now_us() + offset_ms * 1000,
            })
            .collect();
        let failures = (0..3)
            .filter(|node| !answering.contains(node))
            .map(|node| {
                (
                    format!("127.0.0.1:700{node}"),
                    "timed out\nafter 50ms".to_string(),
                )
            })
            .collect();
        Ok(Some(Readings {
            configured: 3,
            samples,
            failures,
        }))
    }

    #[test]
    fn ready_with_a_majority_within_the_offset() {
        let max = Duration::from_millis(500);
        assert_eq!(verdict(false, readings(&[0, 1, 2], 0), max), Ok(()));
        assert_eq!(verdict(false, readings(&[0, 2], 100), max), Ok(()));
        assert_eq!(
            verdict(false, Ok(None), max),
            Ok(()),
            "etcd, the embedded store"
        );
    }

    #[test]
    fn not_ready_says_why_in_one_line() {
        let max = Duration::from_millis(500);
        let no_majority = verdict(false, readings(&[2], 0), max).expect_err("one of three");
        assert!(
            no_majority.starts_with("no majority of the store's nodes answers: 1 of 3"),
            "{no_majority}"
        );
        assert!(
            no_majority.contains("127.0.0.1:7000: timed out after 50ms"),
            "{no_majority}"
        );
        let far = verdict(false, readings(&[0, 1, 2], -2000), max).expect_err("2 s off");
        assert!(far.starts_with("clock offset -"), "{far}");
        assert!(
            far.ends_with("above worker.max_clock_offset (500ms)"),
            "{far}"
        );
        let silent = verdict(
            false,
            Err("the store did not answer\nwithin 2s".to_string()),
            max,
        )
        .expect_err("no answer");
        assert!(silent.contains("did not answer"), "{silent}");
        let stopping = verdict(true, readings(&[0, 1, 2], 0), max).expect_err("shutting down");
        assert!(stopping.starts_with("shutting down"), "{stopping}");
        for reason in [no_majority, far, silent, stopping] {
            assert!(!reason.contains('\n'), "{reason:?}");
        }
    }
}
