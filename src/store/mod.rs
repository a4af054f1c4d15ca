//! The store: the one seam between redcron and what it keeps its state in.
//!
//! The worker and the CLI talk to a [`Store`] — claims and leases ([`crate::lock`]), run history
//! ([`crate::history`]) and membership ([`crate::membership`]) — obtained from [`Store::open`], and never ask
//! which backend they hold. Each backend is one module:
//! - [`redis`]: the Redlock protocol on N independent Redis nodes; every write goes to all nodes, every
//!   answer needs a majority.
//! - [`etcd`]: an etcd cluster; every claim is one transaction, totally ordered by etcd's Raft log, and
//!   its revision is the fencing token.
//! - [`embedded`]: the embedded single-host store, one SQLite file being one node and one majority;
//!   the worker processes of one host may share it.
//!
//! Adding a backend means adding its module, a variant here, and its section of the config.

pub mod embedded;
pub mod etcd;
pub mod redis;

use crate::config::Config;
use crate::history::{Entry, HistorySettings, Query};
use crate::lock::{
    ClaimOutcome, ClaimRequest, InForce, Lease, LockSettings, Pause, PauseOutcome, PauseRead,
    QuorumFailure, RenewError,
};
use crate::membership::Member;
use crate::trigger::TriggerRequest;

/// Failures of a store that are not expected outcomes (the store could not even be set up).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid Redis node URL {url}: {reason}")]
    InvalidNode { url: String, reason: String },
    #[error("{0} Redis nodes configured; at least one is needed")]
    NoNodes(usize),
    #[error("etcd store: {reason}")]
    Etcd { reason: String },
    #[error("embedded store {}: {reason}", path.display())]
    Embedded {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// What a read from the store found, and from how many nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Read<T> {
    pub value: T,
    /// The nodes that did not answer, and why (addresses without passwords); empty for the embedded store.
    pub missing: Vec<(String, String)>,
    /// Data that could not be read (a node returned garbage for an entry): skipped, with what was wrong.
    pub skipped: Vec<String>,
}

/// The note of an entry that a read skipped ([`Read::skipped`]): where it is (`place`: the node), what it
/// is and its key (or id) in the store, and why; cut short, so that a planted megabyte is never quoted
/// whole in a warning or a report.
pub(crate) fn skip_note(place: &str, what: &str, key: &str, why: &dyn std::fmt::Display) -> String {
    let key = crate::logging::shorten(key, 100);
    crate::logging::shorten(&format!("{place}: {what} {key:?} skipped: {why}"), 500)
}

impl Read<Vec<Entry>> {
    /// A single store's answer to a history query: `entries` merged ([`crate::history::merge`]), the
    /// newest `limit` of them, with the entries that could not be read.
    pub(crate) fn newest(entries: Vec<Entry>, limit: usize, skipped: Vec<String>) -> Self {
        let mut merged = crate::history::merge([entries]);
        merged.truncate(limit);
        Read {
            value: merged,
            missing: Vec::new(),
            skipped,
        }
    }
}

/// The store the worker races through and the CLI reads from.
///
/// An enum rather than a trait object: a closed set of backends, and `async fn` stays plain.
pub enum Store {
    Redis(redis::RedisStore),
    /// Boxed: the client's state is large next to the other variants.
    Etcd(Box<etcd::EtcdStore>),
    Embedded(embedded::EmbeddedStore),
}

impl Store {
    /// The store `config` names: its `redis:` nodes, its `etcd:` cluster, or else the embedded store.
    ///
    /// Must be called inside a Tokio runtime. Fails on settings that cannot name a store, and on an
    /// embedded store's database that cannot be opened, or an etcd TLS file that cannot be read (the
    /// error names its path).
    pub fn open(config: &Config) -> Result<Store, StoreError> {
        let history = config.history.clone();
        if let Some(etcd) = &config.etcd {
            let store = etcd::EtcdStore::new(etcd, config.lock.clone(), history)?;
            return Ok(Store::Etcd(Box::new(store)));
        }
        Ok(match &config.redis {
            Some(redis) => Store::Redis(
                redis::RedisStore::new(&redis.nodes, config.lock.clone())?.with_history(history),
            ),
            None => {
                // Validation always sets `embedded` without `redis`; the fallback is its default.
                let path = config.embedded.as_ref().map_or_else(
                    || {
                        config
                            .path
                            .with_file_name(format!("{}.db", config.lock.key_prefix))
                    },
                    |embedded| embedded.path.clone(),
                );
                Store::Embedded(embedded::EmbeddedStore::open(
                    &path,
                    config.lock.clone(),
                    history,
                )?)
            }
        })
    }

    /// Whether other processes share this store: workers on other hosts may race for the same ticks.
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Redis(_) | Store::Etcd(_))
    }

    /// What the store is, for logs: the nodes' addresses (without passwords), `etcd:<endpoints>`, or
    /// `embedded:<path>`.
    pub fn describe(&self) -> String {
        match self {
            Store::Redis(store) => store.node_labels().join(","),
            Store::Etcd(store) => format!("etcd:{}", store.endpoints().join(",")),
            Store::Embedded(store) => format!("embedded:{}", store.path().display()),
        }
    }

    /// Claims each `(job, tick)` in `requests`, answering in the same order.
    ///
    /// All claims go to each node as one pipelined round trip per protocol round, so a tick at which
    /// 10,000 jobs are due costs the same number of round trips as a tick with one.
    pub async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        match self {
            Store::Redis(store) => store.claim_many(requests).await,
            Store::Etcd(store) => store.claim_many(requests).await,
            Store::Embedded(store) => store.claim_many(requests).await,
        }
    }

    /// Claims each request like [`Store::claim_many`] (the same pipelining), but hands each outcome to
    /// `decided`, with the request's index, as soon as it is known, instead of when the whole batch is:
    /// one claim's retries never hold back another's start. Every request gets exactly one outcome.
    pub async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        match self {
            Store::Redis(store) => store.claim_each(requests, decided).await,
            Store::Etcd(store) => store.claim_each(requests, decided).await,
            Store::Embedded(store) => {
                // One transaction decides the whole batch at once: nothing to hand out earlier.
                let outcomes = store.claim_many(requests).await;
                outcomes
                    .into_iter()
                    .enumerate()
                    .for_each(|(index, outcome)| decided(index, outcome));
            }
        }
    }

    /// Claims one `(job, tick)`.
    pub async fn claim(&self, request: &ClaimRequest) -> ClaimOutcome {
        let mut outcomes = self.claim_many(std::slice::from_ref(request)).await;
        outcomes
            .pop()
            .unwrap_or(ClaimOutcome::AlreadyClaimed { by: None })
    }

    /// Extends the lease by a full TTL if a quorum still holds it and its deadline has not passed.
    ///
    /// On failure the lease is marked lost and every later call fails with [`RenewError::AlreadyLost`].
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        match self {
            Store::Redis(store) => store.renew(lease).await,
            Store::Etcd(store) => store.renew(lease).await,
            Store::Embedded(store) => store.renew(lease).await,
        }
    }

    /// Resolves once the store tells, unasked, that `lease` is no longer held — on etcd, a watch of its
    /// lease key (etcd can revoke a lease early: see `EtcdStore::lease_gone`); never on Redis and the
    /// embedded store, whose leases end only as their renewals say. The watchdog stops the job then.
    pub fn lease_gone<'a>(
        &'a self,
        lease: &Lease,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        match self {
            Store::Etcd(store) => Box::pin(store.lease_gone(lease)),
            Store::Redis(_) | Store::Embedded(_) => Box::pin(std::future::pending()),
        }
    }

    /// Releases the lease on every node where it is still this lease's value; the tick claim and the
    /// fencing counter stay. Never deletes another holder's lease.
    pub async fn release(&self, lease: &Lease) {
        match self {
            Store::Redis(store) => store.release(lease).await,
            Store::Etcd(store) => store.release(lease).await,
            Store::Embedded(store) => store.release(lease).await,
        }
    }

    /// One `TIME` to every node, for the worker's clock offset; `None` for the embedded store, whose
    /// only clock is this host's, and for etcd, which has no clock to read (workers keep their own).
    pub async fn read_clocks(&self) -> Option<crate::clock::cluster::Readings> {
        match self {
            Store::Redis(store) => Some(store.read_clocks().await),
            Store::Etcd(_) | Store::Embedded(_) => None,
        }
    }

    /// Writes history entries to every node (one pipeline per node), each kept within the job's bound.
    /// Fails when fewer than a majority took them: they may then be lost with that minority.
    pub async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        match self {
            Store::Redis(store) => store.record(entries).await,
            Store::Etcd(store) => store.record(entries).await,
            Store::Embedded(store) => store.record(entries).await,
        }
    }

    /// The entries of `query`, read from a majority and merged ([`crate::history::merge`]).
    pub async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        match self {
            Store::Redis(store) => store.history(query).await,
            Store::Etcd(store) => store.history(query).await,
            Store::Embedded(store) => store.history(query).await,
        }
    }

    /// Announces `member` (stamped with the store's clock), alive for [`Member::ttl`].
    pub async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        match self {
            Store::Redis(store) => store.announce(member).await,
            Store::Etcd(store) => store.announce(member).await,
            Store::Embedded(store) => store.announce(member).await,
        }
    }

    /// Every worker announced within [`crate::membership::KEEP_DEAD`], alive or not, read from a majority.
    pub async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        match self {
            Store::Redis(store) => store.members().await,
            Store::Etcd(store) => store.members().await,
            Store::Embedded(store) => store.members().await,
        }
    }

    /// Pauses `job` on every node (until `pause.until`, when each node drops it by itself, or until
    /// [`Store::resume`]). Fails when fewer than a majority answered: the job may then still run. Once it
    /// succeeded with [`PauseOutcome::Paused`], no claim of the job is granted whose confirmation had not
    /// reached a node of that majority before the pause did (`docs/protocol.md`, *Pause*); runs under way
    /// go on. Atomically on each node, a pause in force that outlasts this one stays unchanged
    /// ([`PauseOutcome::LongerKept`]) unless `in_force` is [`InForce::Replace`], and a pause that ended
    /// before it was written is not written ([`PauseOutcome::AlreadyOver`]) — see [`Pause::decide`].
    pub async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        match self {
            Store::Redis(store) => store.pause(job, pause, in_force).await,
            Store::Etcd(store) => store.pause(job, pause, in_force).await,
            Store::Embedded(store) => store.pause(job, pause, in_force).await,
        }
    }

    /// Deletes `job`'s pause on every node; `Ok(true)` if a node held one. Fails when fewer than a
    /// majority took the deletion: the job may then stay paused.
    pub async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        match self {
            Store::Redis(store) => store.resume(job).await,
            Store::Etcd(store) => store.resume(job).await,
            Store::Embedded(store) => store.resume(job).await,
        }
    }

    /// The pause of each of `jobs` (in order), read from a majority: the one found on the most nodes, and
    /// on how many.
    pub async fn pauses(
        &self,
        jobs: &[String],
    ) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        match self {
            Store::Redis(store) => store.pauses(jobs).await,
            Store::Etcd(store) => store.pauses(jobs).await,
            Store::Embedded(store) => store.pauses(jobs).await,
        }
    }

    /// Writes a trigger request to every node (`redcron trigger`). Fails when fewer than a majority took
    /// it: it may then still run (once), if a worker reads it from a node that has it.
    pub async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        match self {
            Store::Redis(store) => store.request_trigger(request).await,
            Store::Etcd(store) => store.request_trigger(request).await,
            Store::Embedded(store) => store.request_trigger(request).await,
        }
    }

    /// Every trigger request the nodes keep (those not past their window plus
    /// [`crate::trigger::KEEP_AFTER_WINDOW`]), read from a majority and merged, oldest first.
    pub async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        match self {
            Store::Redis(store) => store.triggers().await,
            Store::Etcd(store) => store.triggers().await,
            Store::Embedded(store) => store.triggers().await,
        }
    }

    /// Deletes a handled trigger request on every node, in the background (what is missed expires).
    pub fn forget_trigger(&self, id: &str) {
        match self {
            Store::Redis(store) => store.forget_trigger(id),
            Store::Etcd(store) => store.forget_trigger(id),
            Store::Embedded(store) => store.forget_trigger(id),
        }
    }

    /// The lock settings this store was built with.
    pub fn settings(&self) -> &LockSettings {
        match self {
            Store::Redis(store) => store.settings(),
            Store::Etcd(store) => store.settings(),
            Store::Embedded(store) => store.settings(),
        }
    }

    /// The history settings this store was built with.
    pub fn history_settings(&self) -> &HistorySettings {
        match self {
            Store::Redis(store) => store.history_settings(),
            Store::Etcd(store) => store.history_settings(),
            Store::Embedded(store) => store.history_settings(),
        }
    }
}
