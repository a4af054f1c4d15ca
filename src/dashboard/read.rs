//! What each page reads from the store, through the [`crate::inspect`] model's reads, bounded in time: a
//! page never waits for the store longer than [`READ_TIMEOUT`], and says why when it could not read.
//!
//! Bounded in number too ([`Reads`]): at most [`READS_AT_ONCE`] pages and `/api` answers are read and
//! sent at once per worker; a request past them waits [`READ_WAIT`] for its turn and is then answered
//! 503 with `Retry-After`. A turn lasts until the answer's last byte is sent, so what the answers hold
//! in memory — the entries read and the body — is at most that many answers' worth, however many
//! clients ask, and the store serves the dashboard that many reads at a time beside the lock's work.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::view::{self, Filter, StateFilter};
use crate::config::{Config, JobConfig};
use crate::history::Entry;
use crate::inspect::status::{self, Status, StatusInputs};
use crate::lock::QuorumFailure;
use crate::store::Store;

/// The longest a page waits for the store, all its reads together (each exchange with a node is bounded
/// by `lock.node_timeout` as well).
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(8);

/// How many reads of every job's history (`/api/status`, the `failing` and `overdue` filters) one worker
/// serves at once. Each holds up to [`status::ENTRIES_IN_FLIGHT`] entries and keeps the store busy, so a
/// few open tabs or scripts cannot take the memory and the store's time the jobs need; the others wait
/// their turn, within [`READ_TIMEOUT`].
const SCANS_AT_ONCE: usize = 2;

/// The turns of the reads of every job's history ([`SCANS_AT_ONCE`]).
pub(super) struct Scans(Semaphore);

impl Scans {
    pub(super) fn new() -> Scans {
        Scans(Semaphore::new(SCANS_AT_ONCE))
    }

    /// Runs `read` in its turn.
    pub(super) async fn scan<T>(&self, read: impl Future<Output = T>) -> T {
        // The semaphore is never closed, so a permit always comes.
        let _turn = self.0.acquire().await.ok();
        read.await
    }
}

/// How many pages and `/api` answers one worker reads and sends at once.
const READS_AT_ONCE: usize = 4;
/// How long a request waits for its turn among [`READS_AT_ONCE`] before it is answered 503.
pub(super) const READ_WAIT: Duration = Duration::from_secs(2);

/// The turns of the dashboard's reads ([`READS_AT_ONCE`]).
pub(super) struct Reads(Arc<Semaphore>);

impl Reads {
    pub(super) fn new() -> Reads {
        Reads(Arc::new(Semaphore::new(READS_AT_ONCE)))
    }

    /// A turn, if one comes within [`READ_WAIT`].
    pub(super) async fn turn(&self) -> Option<OwnedSemaphorePermit> {
        let turn = tokio::time::timeout(READ_WAIT, Arc::clone(&self.0).acquire_owned());
        turn.await.ok()?.ok()
    }
}

/// `response`, whose body holds `turn` until its last byte is sent (or the connection is dropped).
pub(super) fn holding(turn: OwnedSemaphorePermit, response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _held = &turn;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Why a page could not read the store.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadFailure {
    #[error("the store could not be reached: no majority: {} of {} nodes answered, {} needed", .0.granted, .0.configured, .0.needed)]
    NoMajority(QuorumFailure),
    #[error("the store did not answer within {} s", READ_TIMEOUT.as_secs())]
    Timeout,
}

/// Runs `read` within [`READ_TIMEOUT`].
pub(super) async fn bounded<T>(
    read: impl Future<Output = Result<T, QuorumFailure>>,
) -> Result<T, ReadFailure> {
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => Err(ReadFailure::NoMajority(failure)),
        Err(_) => Err(ReadFailure::Timeout),
    }
}

/// `/`'s jobs: the page of the config's jobs that `filter` selects, with their status and the entries of
/// their strips.
pub(super) struct Overview {
    pub status: Status,
    /// Each listed job's newest entries, in the order of `status.jobs`.
    pub entries: Vec<Vec<Entry>>,
    pub page: usize,
    pub pages: usize,
    /// How many jobs the filter selects, on every page.
    pub total: usize,
}

/// Reads `/`'s page: the jobs of `config` that `filter` selects (reading what the state filter needs of
/// every job the name matches: the pauses, the members, or for `failing` and `overdue` the histories),
/// then the status of the page's jobs only.
pub(super) async fn overview(
    store: &Store,
    scans: &Scans,
    config: &Config,
    filter: &Filter,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Overview, ReadFailure> {
    let named: Vec<&JobConfig> = config.jobs.iter().filter(|j| filter.admits(j)).collect();
    let selected: Vec<&JobConfig> = match filter.state {
        StateFilter::All | StateFilter::Disabled => named,
        StateFilter::Paused => {
            let names: Vec<String> = named.iter().map(|j| j.name.clone()).collect();
            let pauses = bounded(store.pauses(&names)).await?.value;
            named
                .into_iter()
                .zip(pauses)
                .filter_map(|(job, pause)| pause.map(|_| job))
                .collect()
        }
        StateFilter::Running => {
            let members = bounded(store.members()).await?.value;
            let running: HashSet<&str> = members
                .iter()
                .filter(|m| m.alive)
                .flat_map(|m| m.running.iter().map(|r| r.job.as_str()))
                .collect();
            named
                .into_iter()
                .filter(|j| running.contains(j.name.as_str()))
                .collect()
        }
        StateFilter::Failing | StateFilter::Overdue => {
            let read = status::read_status(store, config, &named, view::ENTRIES_FOR_STRIP, now);
            let found = bounded(scans.scan(read)).await?;
            named
                .into_iter()
                .zip(found.jobs)
                .filter(|(_, found)| match filter.state {
                    StateFilter::Failing => found.failures_in_a_row > 0,
                    _ => found.overdue.is_some(),
                })
                .map(|(job, _)| job)
                .collect()
        }
    };
    let page = view::page(selected, filter.page, filter.per_page);
    let inputs = bounded(status::read_jobs(
        store,
        &page.items,
        view::ENTRIES_FOR_STRIP,
    ))
    .await?;
    let entries = inputs.histories.clone();
    Ok(Overview {
        status: status::status_of(config, &page.items, inputs, now),
        entries,
        page: page.number,
        pages: page.pages,
        total: page.total,
    })
}

/// One job's status (and its newest `entries` entries), or the workers' alone with no job.
pub(super) async fn status_of(
    store: &Store,
    config: &Config,
    jobs: &[&JobConfig],
    entries: usize,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(Status, Vec<Vec<Entry>>), ReadFailure> {
    let inputs: StatusInputs = bounded(status::read_jobs(store, jobs, entries)).await?;
    let histories = inputs.histories.clone();
    Ok((status::status_of(config, jobs, inputs, now), histories))
}
