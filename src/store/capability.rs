//! What every store does, as traits: the contract a backend implements, one trait per capability.
//!
//! A backend implements all six ([`Backend`]); [`super::Store`] dispatches to them through one `match`,
//! which requires every variant's type to be a [`Backend`], so a new store that misses a capability — or
//! one method of one — does not compile. No method has a default: what is right for one store (a lease
//! that ends only as its renewals say, no clocks to read) is wrong for another, so each store says it.
//!
//! Futures are `Send` (the worker runs them on its multi-threaded runtime) except [`Claims::claim_each`]'s,
//! which is `Send` when the caller's `decided` is. A method that waits on the store returns within the
//! bounds the lock settings give (`node_timeout` per node or request), never hangs on a hung node.

use std::future::Future;

use crate::clock::cluster::Readings;
use crate::history::{Entry, HistorySettings, Query};
use crate::lock::{
    ClaimOutcome, ClaimRequest, InForce, Lease, LockSettings, Pause, PauseOutcome, PauseRead,
    QuorumFailure, RenewError,
};
use crate::membership::Member;
use crate::trigger::TriggerRequest;

use super::{Read, StoreError};

/// Claims of `(job, tick)`: the lease, the tick's claim record and the fencing token, at once.
pub trait Claims {
    /// Claims each `(job, tick)` in `requests`, answering in the same order.
    ///
    /// The claims go to each node together: on Redis one pipelined round trip per protocol round for
    /// every [`crate::store::redis::scripts::CLAIMS_PER_ATTEMPT`] claims (attempts one after the other,
    /// so that what one holds in memory is bounded), so a tick at which 10,000 jobs are due costs 79
    /// round trips per round, not 10,000.
    fn claim_many(
        &self,
        requests: &[ClaimRequest],
    ) -> impl Future<Output = Vec<ClaimOutcome>> + Send;

    /// Claims each request like [`Claims::claim_many`] (the same pipelining), but hands each outcome to
    /// `decided`, with the request's index, as soon as it is known, instead of when the whole batch is:
    /// one claim's retries never hold back another's start. Every request gets exactly one outcome.
    fn claim_each(
        &self,
        requests: &[ClaimRequest],
        decided: impl FnMut(usize, ClaimOutcome),
    ) -> impl Future<Output = ()>;
}

/// The life of a won lease: renewed, watched, released.
pub trait Leases {
    /// Extends the lease by a full TTL if a quorum still holds it and its deadline has not passed.
    ///
    /// On failure the lease is marked lost and every later call fails with [`RenewError::AlreadyLost`].
    fn renew(&self, lease: &mut Lease) -> impl Future<Output = Result<(), RenewError>> + Send;

    /// Resolves once the store tells, unasked, that `lease` is no longer held — on etcd, a watch of its
    /// lease key (etcd can revoke a lease early: see the etcd store's `lease.rs`); never on a store
    /// whose leases end only as their renewals say (Redis, the embedded store). The watchdog stops the
    /// job then.
    fn lease_gone<'a>(&'a self, lease: &Lease) -> impl Future<Output = ()> + Send + use<'a, Self>;

    /// Releases the lease on every node where it is still this lease's value; the tick claim and the
    /// fencing counter stay. Never deletes another holder's lease.
    fn release(&self, lease: &Lease) -> impl Future<Output = ()> + Send;

    /// As [`Leases::release`], for a caller that does not need the unlock at once (a run that ended): the
    /// store may hold it a few milliseconds to send it with others (Redis gathers the releases of one
    /// tick's short runs into one script call per node), or release at once.
    fn release_soon(&self, lease: &Lease) -> impl Future<Output = ()> + Send;
}

/// Run history and membership: what ran, and which workers are there.
pub trait Records {
    /// Writes history entries to every node (one pipeline per node), each kept within the job's bound.
    /// Fails when fewer than a majority took them: they may then be lost with that minority.
    fn record(&self, entries: &[Entry]) -> impl Future<Output = Result<(), QuorumFailure>> + Send;

    /// The entries of `query`, read from a majority and merged ([`crate::history::merge`]).
    fn history(
        &self,
        query: &Query,
    ) -> impl Future<Output = Result<Read<Vec<Entry>>, QuorumFailure>> + Send;

    /// Announces `member` (stamped with the store's clock), alive for [`Member::ttl`].
    fn announce(&self, member: &Member) -> impl Future<Output = Result<(), QuorumFailure>> + Send;

    /// Every worker announced within [`crate::membership::KEEP_DEAD`], alive or not, read from a majority.
    fn members(&self) -> impl Future<Output = Result<Read<Vec<Member>>, QuorumFailure>> + Send;
}

/// Pauses of jobs (`redcron pause`, `resume`).
pub trait Pauses {
    /// Pauses `job` on every node (until `pause.until`, when each node drops it by itself, or until
    /// [`Pauses::resume`]). Fails when fewer than a majority answered: the job may then still run. Once
    /// it succeeded with [`PauseOutcome::Paused`], no claim of the job is granted whose confirmation had
    /// not reached a node of that majority before the pause did (`docs/protocol.md`, *Pause*); runs under
    /// way go on. Atomically on each node, a pause in force that outlasts this one stays unchanged
    /// ([`PauseOutcome::LongerKept`]) unless `in_force` is [`InForce::Replace`], and a pause that ended
    /// before it was written is not written ([`PauseOutcome::AlreadyOver`]) — see [`Pause::decide`].
    fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> impl Future<Output = Result<PauseOutcome, QuorumFailure>> + Send;

    /// Deletes `job`'s pause on every node; `Ok(true)` if a node held one. Fails when fewer than a
    /// majority took the deletion: the job may then stay paused.
    fn resume(&self, job: &str) -> impl Future<Output = Result<bool, QuorumFailure>> + Send;

    /// The pause of each of `jobs` (in order), read from a majority: the one found on the most nodes, and
    /// on how many.
    fn pauses(
        &self,
        jobs: &[String],
    ) -> impl Future<Output = Result<Read<Vec<Option<PauseRead>>>, QuorumFailure>> + Send;
}

/// Trigger requests (`redcron trigger`): runs asked for outside the schedule.
pub trait Triggers {
    /// Writes a trigger request to every node. Fails when fewer than a majority took it: it may then
    /// still run (once), if a worker reads it from a node that has it.
    fn request_trigger(
        &self,
        request: &TriggerRequest,
    ) -> impl Future<Output = Result<(), QuorumFailure>> + Send;

    /// Every trigger request the nodes keep (those not past their window plus
    /// [`crate::trigger::KEEP_AFTER_WINDOW`]), read from a majority and merged, oldest first.
    fn triggers(
        &self,
    ) -> impl Future<Output = Result<Read<Vec<TriggerRequest>>, QuorumFailure>> + Send;

    /// Deletes a handled trigger request on every node, in the background (what is missed expires).
    fn forget_trigger(&self, id: &str);
}

/// What the store is and whether it answers: for logs, `/readyz` and the clock check.
pub trait Health {
    /// What the store is, for logs: the nodes' addresses (without passwords), `etcd:<endpoints>`, or
    /// `embedded:<path>`.
    fn describe(&self) -> String;

    /// The nodes [`Health::describe`] names, one label each (a Sentinel group's label holds commas):
    /// what the dashboard lists, and what a [`super::Read`]'s `missing` names.
    fn nodes(&self) -> Vec<String>;

    /// Each part of the store that moves on its own — a Redis Sentinel group — with its master as this
    /// process last found it and the failovers it has seen. Empty for every other store, the default.
    fn groups(&self) -> Vec<super::GroupState> {
        Vec::new()
    }

    /// Whether other processes share this store: workers on other hosts may race for the same ticks.
    fn is_shared(&self) -> bool;

    /// The lock settings this store was built with.
    fn settings(&self) -> &LockSettings;

    /// The history settings this store was built with.
    fn history_settings(&self) -> &HistorySettings;

    /// The nodes' clocks, for the worker's clock offset: one `TIME` to every Redis node; `None` for a
    /// store without clocks to read (the embedded store, whose only clock is this host's; etcd, whose
    /// workers keep their own).
    fn read_clocks(&self) -> impl Future<Output = Option<Readings>> + Send;

    /// Whether the store answers now as a claim needs it to (`/readyz`), bounded by `node_timeout`:
    /// `Ok(Some(readings))` for a store whose readiness is its clocks (Redis: whether a majority answered
    /// `TIME`, and this host's offset to them, are judged from the readings), `Ok(None)` when it answered
    /// (etcd: a linearizable read, which only a majority of members can serve; the embedded store: its
    /// file's write lock taken and let go), or `Err` with why not, in one line.
    fn readiness(&self) -> impl Future<Output = Result<Option<Readings>, String>> + Send;

    /// Makes the store ready for its first call, once, and says whether it can ever be used: the SQL
    /// store connects, checks the server's version and its tables, and creates them on a new database.
    /// `Err` only for what will not get better by itself (refused credentials, a missing database, a
    /// server too old, tables of a newer redcron); a server that does not answer yet is `Ok`, and the
    /// calls that need it fail as a node's do. The worker stops at start on `Err`. Stores with nothing to
    /// prepare (Redis, etcd, the embedded store, which opens its file in `open`) answer `Ok` at once.
    fn prepare(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Every capability: what a type must implement to be a variant of [`super::Store`].
pub trait Backend: Claims + Leases + Records + Pauses + Triggers + Health + Send + Sync {}

impl<T: Claims + Leases + Records + Pauses + Triggers + Health + Send + Sync> Backend for T {}

/// `store` itself, once the compiler has checked that its type is a [`Backend`]: the dispatch of
/// [`super::Store`] passes every variant through it.
pub(crate) fn backend<B: Backend>(store: &B) -> &B {
    store
}
