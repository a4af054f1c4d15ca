//! The store: the one seam between redcron and what it keeps its state in.
//!
//! The worker and the CLI talk to a [`Store`] — claims and leases ([`crate::lock`]), run history
//! ([`crate::history`]), membership ([`crate::membership`]), pauses and trigger requests — obtained from
//! [`Store::open`], and never ask which backend they hold. What a store must do is the contract of
//! [`capability`]: one trait per capability ([`Claims`], [`Leases`], [`Records`], [`Pauses`],
//! [`Triggers`], [`Health`]), each method with its guarantee; only [`Health::groups`], which one store
//! has, has a default. Each backend is one module that implements them all:
//! - [`redis`]: the Redlock protocol on N independent Redis nodes; every write goes to all nodes, every
//!   answer needs a majority.
//! - [`etcd`]: an etcd cluster; every claim is one transaction, totally ordered by etcd's Raft log, and
//!   its revision is the fencing token.
//! - [`sql`]: one PostgreSQL or MySQL/MariaDB database; every claim is one transaction that locks its
//!   job's fence row, with times from the database's clock.
//! - [`zookeeper`]: a ZooKeeper ensemble; every claim is one multi-op that rewrites its job's fence node
//!   at the version read, its zxid is the fencing token, and a lease is an ephemeral node of the winner's
//!   session.
//! - [`embedded`]: the embedded single-host store, one SQLite file being one node and one majority;
//!   the worker processes of one host may share it.
//!
//! Adding a backend touches, and the compiler points at each once the first is written:
//! - its module here (`src/store/<name>/`), implementing every trait of [`capability`] — a missing
//!   method is a compile error;
//! - a variant of [`Store`] and its arm in `each_store!` (the one `match`, which requires the variant to
//!   be a [`Backend`]);
//! - a variant of [`crate::config::StoreConfig`], whose methods (section name, the variables kept from
//!   jobs, `check`'s line, node count) are `match`es that then fail to compile, and its arm in
//!   [`Store::open`]; its section's parsing (`config/raw.rs`) and checks (`config/validate.rs`, with the
//!   one-section rule's list there);
//! - its docs (its page docs/store-<name>.md, or the Redis rows of docs/configuration.md), and its run of the store tests.

pub mod capability;
pub mod embedded;
pub mod etcd;
mod pace;
pub mod redis;
pub mod sql;
pub mod zookeeper;

pub use capability::{Backend, Claims, Health, Leases, Pauses, Records, Triggers};

use crate::clock::cluster::{estimate, Estimate};
use crate::config::{Config, StoreConfig};
use crate::history::{Entry, HistorySettings, Query};
use crate::lock::quorum::quorum;
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
    /// A certificate file of `redis:` that cannot be read or parsed (`field` is `redis.ca_file`, …).
    #[error("{field} {}: {reason}", path.display())]
    RedisTls {
        field: &'static str,
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("etcd store: {reason}")]
    Etcd { reason: String },
    /// A SQL store that cannot be used: `target` is `host:port/database` (never a password).
    #[error("{dialect} store {target}: {reason}")]
    Sql {
        dialect: &'static str,
        target: String,
        reason: String,
    },
    /// A ZooKeeper store that cannot be used (a TLS file that cannot be read, a node of the store that its
    /// user cannot make its own): never a password.
    #[error("ZooKeeper store: {reason}")]
    Zookeeper { reason: String },
    #[error("embedded store {}: {reason}", path.display())]
    Embedded {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// A Sentinel-managed group of a Redis store as this process sees it ([`Health::groups`]): `status`,
/// `/readyz`, `/metrics` and the dashboard show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupState {
    /// The group's label, `sentinel://MASTER@host:port,…` (never a password).
    pub group: String,
    /// `host:port` of the master this process last connected to (`ROLE` confirmed it); `None` before
    /// the first connection.
    pub master: Option<String>,
    /// How often a new connection found the master at another address than before.
    pub failovers: u64,
    /// When the last of those moves was found.
    pub last_failover: Option<chrono::DateTime<chrono::Utc>>,
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
/// An enum rather than a trait object: a closed set of backends, and `async fn` stays plain. Every method
/// is the capability of the same name ([`capability`]), dispatched by `each_store!` — the one `match` over
/// the variants, which also checks at compile time that each variant's type implements every capability.
pub enum Store {
    Redis(redis::RedisStore),
    /// Boxed: the client's state is large next to the other variants.
    Etcd(Box<etcd::EtcdStore>),
    Embedded(embedded::EmbeddedStore),
    /// Boxed: the pool's state is large next to the other variants.
    Sql(Box<sql::SqlStore>),
    /// Boxed: the session's state is large next to the other variants.
    Zookeeper(Box<zookeeper::ZookeeperStore>),
}

/// Runs `$body` with `$store` bound to the backend inside `$self` (a `&Store`): the one `match` over the
/// variants. Each arm hands its backend through [`capability::backend`], so a variant whose type misses a
/// capability does not compile, and a new variant makes this match (and only this one) non-exhaustive.
macro_rules! each_store {
    ($self:expr, $store:ident => $body:expr) => {
        match $self {
            Store::Redis($store) => {
                let $store = capability::backend($store);
                $body
            }
            Store::Etcd($store) => {
                let $store = capability::backend(&**$store);
                $body
            }
            Store::Embedded($store) => {
                let $store = capability::backend($store);
                $body
            }
            Store::Sql($store) => {
                let $store = capability::backend(&**$store);
                $body
            }
            Store::Zookeeper($store) => {
                let $store = capability::backend(&**$store);
                $body
            }
        }
    };
}

/// `TIME` rounds per measurement; each node's fastest exchange counts, so one slow answer (the first
/// one waits for the connection) does not blur the offset.
const CLOCK_ROUNDS: usize = 3;

impl Store {
    /// The store `config` names ([`crate::config::StoreConfig`]).
    ///
    /// Must be called inside a Tokio runtime. Fails on settings that cannot name a store, and on an
    /// embedded store's database that cannot be opened, or an etcd TLS file that cannot be read (the
    /// error names its path).
    pub fn open(config: &Config) -> Result<Store, StoreError> {
        let (lock, history) = (config.lock.clone(), config.history.clone());
        Ok(match &config.store {
            StoreConfig::Redis(redis) => {
                Store::Redis(redis::RedisStore::open(redis, lock)?.with_history(history))
            }
            StoreConfig::Etcd(etcd) => {
                Store::Etcd(Box::new(etcd::EtcdStore::new(etcd, lock, history)?))
            }
            StoreConfig::Embedded(embedded) => Store::Embedded(embedded::EmbeddedStore::open(
                &embedded.path,
                lock,
                history,
            )?),
            StoreConfig::Sql(sql) => Store::Sql(Box::new(sql::SqlStore::new(sql, lock, history)?)),
            StoreConfig::Zookeeper(zk) => {
                Store::Zookeeper(Box::new(zookeeper::ZookeeperStore::new(zk, lock, history)?))
            }
        })
    }

    /// See [`Health::is_shared`].
    pub fn is_shared(&self) -> bool {
        each_store!(self, store => store.is_shared())
    }

    /// See [`Health::describe`].
    pub fn describe(&self) -> String {
        each_store!(self, store => store.describe())
    }

    /// See [`Health::nodes`].
    pub fn nodes(&self) -> Vec<String> {
        each_store!(self, store => store.nodes())
    }

    /// See [`Health::groups`].
    pub fn groups(&self) -> Vec<GroupState> {
        each_store!(self, store => store.groups())
    }

    /// See [`Claims::claim_many`].
    pub async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        each_store!(self, store => store.claim_many(requests).await)
    }

    /// See [`Claims::claim_each`].
    pub async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        decided: impl FnMut(usize, ClaimOutcome),
    ) {
        each_store!(self, store => store.claim_each(requests, decided).await)
    }

    /// Claims one `(job, tick)`.
    pub async fn claim(&self, request: &ClaimRequest) -> ClaimOutcome {
        let mut outcomes = self.claim_many(std::slice::from_ref(request)).await;
        outcomes
            .pop()
            .unwrap_or_else(|| ClaimOutcome::unanswered(1))
    }

    /// See [`Leases::renew`].
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        each_store!(self, store => store.renew(lease).await)
    }

    /// See [`Leases::lease_gone`].
    pub fn lease_gone<'a>(
        &'a self,
        lease: &Lease,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        each_store!(self, store => Box::pin(store.lease_gone(lease)))
    }

    /// See [`Leases::release`].
    pub async fn release(&self, lease: &Lease) {
        each_store!(self, store => store.release(lease).await)
    }

    /// See [`Leases::release_soon`].
    pub async fn release_soon(&self, lease: &Lease) {
        each_store!(self, store => store.release_soon(lease).await)
    }

    /// See [`Health::read_clocks`].
    pub async fn read_clocks(&self) -> Option<crate::clock::cluster::Readings> {
        each_store!(self, store => store.read_clocks().await)
    }

    /// Up to [`CLOCK_ROUNDS`] rounds of `TIME` to every node (fewer if a round misses a majority); the offset
    /// from all their answers, or why there is none. `None` for the embedded store and etcd, which have no
    /// clock to read. The worker's clock task and `redcron trigger` measure alike.
    pub async fn measure_offset(&self) -> Option<Result<Estimate, QuorumFailure>> {
        let mut samples = Vec::new();
        let (mut configured, mut failures) = (0, Vec::new());
        for _ in 0..CLOCK_ROUNDS {
            let readings = self.read_clocks().await?;
            let enough = readings.samples.len() >= quorum(readings.configured);
            configured = readings.configured;
            failures = readings.failures;
            samples.extend(readings.samples);
            if !enough {
                break;
            }
        }
        Some(
            estimate(&samples, configured, quorum(configured)).map_err(|too_few| QuorumFailure {
                unheard: Vec::new(),
                refused: Vec::new(),
                configured: too_few.configured,
                needed: too_few.needed,
                granted: too_few.sampled,
                failures,
            }),
        )
    }

    /// See [`Health::prepare`].
    pub async fn prepare(&self) -> Result<(), StoreError> {
        each_store!(self, store => store.prepare().await)
    }

    /// See [`Health::readiness`].
    pub async fn readiness(&self) -> Result<Option<crate::clock::cluster::Readings>, String> {
        each_store!(self, store => store.readiness().await)
    }

    /// See [`Records::record`].
    pub async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        each_store!(self, store => store.record(entries).await)
    }

    /// See [`Records::history`].
    pub async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        each_store!(self, store => store.history(query).await)
    }

    /// See [`Records::announce`].
    pub async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        each_store!(self, store => store.announce(member).await)
    }

    /// See [`Records::members`].
    pub async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        each_store!(self, store => store.members().await)
    }

    /// See [`Pauses::pause`].
    pub async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        each_store!(self, store => store.pause(job, pause, in_force).await)
    }

    /// See [`Pauses::resume`].
    pub async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        each_store!(self, store => store.resume(job).await)
    }

    /// See [`Pauses::pauses`].
    pub async fn pauses(
        &self,
        jobs: &[String],
    ) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        each_store!(self, store => store.pauses(jobs).await)
    }

    /// See [`Triggers::request_trigger`].
    pub async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        each_store!(self, store => store.request_trigger(request).await)
    }

    /// See [`Triggers::triggers`].
    pub async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        each_store!(self, store => store.triggers().await)
    }

    /// See [`Triggers::forget_trigger`].
    pub fn forget_trigger(&self, id: &str) {
        each_store!(self, store => store.forget_trigger(id))
    }

    /// See [`Health::settings`].
    pub fn settings(&self) -> &LockSettings {
        each_store!(self, store => store.settings())
    }

    /// See [`Health::history_settings`].
    pub fn history_settings(&self) -> &HistorySettings {
        each_store!(self, store => store.history_settings())
    }
}
