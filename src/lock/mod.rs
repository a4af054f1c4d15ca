//! Leases, tick claims and fencing tokens.
//!
//! A store ([`crate::store::Store`]) answers one question for the worker: *may I run `(job, tick)`, and with
//! which fencing token?* Expected answers are values ([`ClaimOutcome`]), failures of the store itself are
//! errors.
//!
//! The stores of [`crate::store`] implement these answers ([`crate::store::Claims`],
//! [`crate::store::Leases`]), whichever section of the config names them: the Redlock protocol across N
//! independent Redis nodes (`redis:`; its safety argument is in `docs/protocol.md` and beside each
//! script), one transaction per claim in an etcd cluster (`etcd:`), and the embedded store for a single
//! host (`embedded:`, or no store section). All write the names of [`keys`]. [`order`] says when each
//! worker starts claiming a `(job, tick)`, so that contention is rare; no guarantee depends on it.

pub(crate) mod decision;
pub mod keys;
pub mod order;
pub mod pause;
pub mod quorum;
pub mod series;
pub(crate) mod validity;

use std::time::Duration;

use crate::clock::boot::BootInstant;
use crate::schedule::Tick;

pub use keys::Holder;
pub use pause::{InForce, Pause, PauseOutcome, PauseRead};
pub use series::Series;
pub use validity::{
    default_stop_grace, drift, renew_when_left, renewal_slack, validity, MAX_DEFAULT_STOP_GRACE,
};

/// Lock parameters shared by every store.
#[derive(Debug, Clone, PartialEq)]
pub struct LockSettings {
    /// How long a lease lives on a node unless renewed.
    pub ttl: Duration,
    /// How often the watchdog renews a running job's lease; below `ttl`.
    pub renew_every: Duration,
    /// How long one node may take to answer one round before it counts as failed; far below `ttl`.
    pub node_timeout: Duration,
    /// Allowed clock-rate difference between hosts, as a fraction of the TTL (Redlock's drift factor).
    pub drift_factor: f64,
    /// How many more times a split vote is retried.
    pub retries: u32,
    /// Base delay between retries; a random jitter of up to the same amount is added.
    pub retry_delay: Duration,
    /// Prefix of every key; keys are `<prefix>:{<job>}:<kind>`.
    pub key_prefix: String,
}

impl Default for LockSettings {
    fn default() -> Self {
        LockSettings {
            ttl: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            retries: 3,
            retry_delay: Duration::from_millis(200),
            key_prefix: "redcron".to_string(),
        }
    }
}

/// Whether a tick may start while an earlier run of the same job still holds the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// One lease per job: a tick that finds the previous run still holding the job is skipped.
    #[default]
    Skip,
    /// One lease per (job, tick): runs of successive ticks may overlap.
    Allow,
}

/// What a worker asks for: the right to run `job` at `tick`.
///
/// A request is one *claimant* (see [`keys`]): claiming the same request again — a retry after a
/// `NoQuorum` or `Contended` outcome — continues the same claim, and finds its own earlier confirmations on
/// the nodes as its own, so an ambiguous round is never lost by retrying it. A new request is a new
/// contender. Never claim a request again after it was `Won`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    pub job: String,
    pub tick: Tick,
    pub overlap: Overlap,
    /// The job's definition as this worker sees it ([`crate::config::JobConfig::fingerprint`]); carried in
    /// the lease value so that workers running different versions of the job can tell.
    pub fingerprint: String,
    /// `<worker id>/<uuid>`, unique to this request.
    pub claimant: String,
    /// The series of the claim ([`Series`]): the schedule unless set by [`ClaimRequest::in_series`].
    pub series: Series,
    /// For a claim outside the schedule: the end of its window (cluster time, milliseconds). The nodes
    /// refuse a claim of it after this instant on their clocks, and drop its claim record
    /// [`ONE_OFF_RECORD_KEEP`] later.
    pub not_after: Option<Tick>,
}

/// How long the claim record of a trigger or a retry outlives the end of its window on each node: no
/// claim of it is granted after its window (the nodes refuse), so the record is needed only until then;
/// the margin covers a node clock that steps back.
pub const ONE_OFF_RECORD_KEEP: Duration = Duration::from_secs(3600);

impl ClaimRequest {
    /// A new claimant of `(job, tick)` for worker `worker_id`, in the schedule's series.
    pub fn new(
        worker_id: &str,
        job: &str,
        tick: Tick,
        overlap: Overlap,
        fingerprint: &str,
    ) -> ClaimRequest {
        ClaimRequest {
            job: job.to_string(),
            tick,
            overlap,
            fingerprint: fingerprint.to_string(),
            claimant: keys::new_claimant(worker_id),
            series: Series::Schedule,
            not_after: None,
        }
    }

    /// The same request in `series` (a trigger or a retry), claimable until `not_after` (cluster time).
    pub fn in_series(self, series: Series, not_after: Tick) -> ClaimRequest {
        ClaimRequest {
            series,
            not_after: Some(not_after),
            ..self
        }
    }

    /// When the nodes drop this request's claim record (milliseconds, cluster time), if they do.
    pub(crate) fn record_expires_at(&self) -> Option<i64> {
        let keep = i64::try_from(ONE_OFF_RECORD_KEEP.as_millis()).unwrap_or(i64::MAX);
        self.not_after
            .map(|not_after| not_after.as_millis().saturating_add(keep))
    }
}

/// A fencing token: strictly increasing over all granted leases of one job, across all workers.
///
/// Hand it to the job's storage so that it can reject a write from a holder whose lease was taken over.
/// Never above [`keys::MAX_TOKEN`].
pub type FencingToken = u64;

/// How far a claim's tick may be ahead of the store's clock (a Redis node's, the embedded store's host's;
/// etcd has no clock and does not check it): further, the store refuses it ([`Refusal::TickAhead`]).
///
/// A worker claims a tick once its cluster time has reached it, and a trigger request's tick is the
/// cluster time it was asked at, so an honest tick is ahead of a node's clock by no more than the offset
/// between the two; an hour is far beyond that (the one-off claim records already assume that a node's
/// clock never steps back by an hour). What it stops is a clock far off — a host at the year 2300 — that
/// would push the token floor ([`keys::token_floor`]) of every later run of the job up by its offset and,
/// by G1′, make every earlier tick of the schedule unclaimable.
pub const MAX_TICK_AHEAD: Duration = Duration::from_secs(3600);

/// Why a store refused a claim outright, whoever else claims: its tick or its token is out of the bounds
/// that the protocol keeps (`docs/protocol.md`, *The floor*). Claiming again changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The tick is more than [`MAX_TICK_AHEAD`] ahead of the store's clock, which read `store_ms`.
    #[error("tick {tick} is more than {} ahead of the store's clock ({}): the clock that chose it is wrong",
            crate::clock::show_duration(MAX_TICK_AHEAD), Tick(*store_ms))]
    TickAhead { tick: Tick, store_ms: i64 },
    /// The claim's token would pass [`keys::MAX_TOKEN`]: the highest fence counter read is `fence`, the
    /// tick's floor is that of `tick`.
    #[error("the job's next fencing token would pass 2^63 - 1 (fence counter {fence}, tick {tick}): its \
             fence counter was set past any token a clock of this era gives; reset it (docs/protocol.md)")]
    TokenLimit { fence: FencingToken, tick: Tick },
}

impl Refusal {
    /// The refusal as a stable word for events and the history: `tick_ahead`, `token_limit`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TickAhead { .. } => "tick_ahead",
            Refusal::TokenLimit { .. } => "token_limit",
        }
    }
}

/// The expected answers to a claim; none of them is an error.
///
/// [`ClaimOutcome::retry_in`] tells the outcomes that are final from those that a retry of the same request
/// may still turn into a win while the tick's grace lasts.
#[derive(Debug)]
pub enum ClaimOutcome {
    /// This worker holds the lease and has claimed the tick for good.
    Won(Lease),
    /// The tick (or a later one) was confirmed by another claimant on so many nodes that this one can no
    /// longer reach a majority: it must not run here. `by` is that claimant where a node said. Final.
    AlreadyClaimed { by: Option<Holder> },
    /// The job's lease is held by another tick's run (`overlap: skip`): this tick is skipped. `ttl` is what
    /// remains of that lease on a node that told us. Final.
    Busy {
        holder: Option<Holder>,
        ttl: Option<Duration>,
    },
    /// Another claimant of the *same* tick holds the lease on some nodes without having confirmed the tick
    /// on a majority: it is between its rounds, or it crashed there. Not final: retry the same request after
    /// `retry_in` (by then that contender has confirmed, given up, or its lease has expired).
    Contended {
        holder: Option<Holder>,
        retry_in: Duration,
    },
    /// No majority of the configured nodes answered in time; the reasons name each failed node. Not final:
    /// retry the same request.
    NoQuorum(QuorumFailure),
    /// The job is paused (`redcron pause`) on so many nodes that no majority is left for this claim: the
    /// tick is skipped. Final.
    Paused(Pause),
    /// So many nodes refused the claim as out of bounds (its tick far ahead of their clocks, or a token
    /// past [`keys::MAX_TOKEN`]) that no majority is left for it. Final.
    Refused(Refusal),
    /// The store answers, but no claim can be made on it until someone acts ([`StoreFault`]): nothing was
    /// granted. Not final, like `NoQuorum`: retried (the rights may be granted back), and logged as
    /// what it is.
    Fault(StoreFault),
}

impl ClaimOutcome {
    /// The outcome of a request that a store's batch left without one (a bug: every batch answers each
    /// of its requests), on a store of `configured` nodes: `NoQuorum`, so the claim is retried while the
    /// tick's window lasts. A retry cannot run the tick twice — it is decided on the store again —
    /// where a final answer such as `AlreadyClaimed` would skip a tick that nobody may have run.
    pub fn unanswered(configured: usize) -> ClaimOutcome {
        ClaimOutcome::NoQuorum(QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured,
            needed: quorum::quorum(configured),
            granted: 0,
            failures: vec![(
                "the store".to_string(),
                "the claim got no outcome (a bug); it is retried".to_string(),
            )],
        })
    }

    /// For outcomes that a retry of the same request may still turn into a win: how soon to retry at the
    /// earliest (`None` for the final outcomes, `Won` included).
    pub fn retry_in(&self) -> Option<Duration> {
        match self {
            ClaimOutcome::Contended { retry_in, .. } => Some(*retry_in),
            ClaimOutcome::NoQuorum(_) | ClaimOutcome::Fault(_) => Some(Duration::ZERO),
            ClaimOutcome::Won(_)
            | ClaimOutcome::AlreadyClaimed { .. }
            | ClaimOutcome::Busy { .. }
            | ClaimOutcome::Paused(_)
            | ClaimOutcome::Refused(_) => None,
        }
    }

    /// The other claimant named by this outcome, if any.
    pub fn other(&self) -> Option<&Holder> {
        match self {
            ClaimOutcome::AlreadyClaimed { by } => by.as_ref(),
            ClaimOutcome::Busy { holder, .. } | ClaimOutcome::Contended { holder, .. } => {
                holder.as_ref()
            }
            ClaimOutcome::Won(_)
            | ClaimOutcome::NoQuorum(_)
            | ClaimOutcome::Paused(_)
            | ClaimOutcome::Refused(_)
            | ClaimOutcome::Fault(_) => None,
        }
    }
}

/// Why a store that answers cannot take claims until someone acts: not a missing majority (nothing to
/// wait for), so it is logged at ERROR with its own reason and makes `/readyz` not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreFault {
    /// The embedded store's database file at `path` is no longer the file this worker opened (deleted, or
    /// replaced by another): its claims would be invisible to the workers that open the path now, and
    /// theirs to it, so the same tick could run twice. Nothing is claimed or renewed on it any more.
    #[error("{path}: {what}: this worker's connection is on a file that workers starting now do not see, so it claims nothing; restart every worker that shares the file, so that all of them open the same one")]
    FileReplaced { path: String, what: String },
    /// The SQL server refused a statement for want of a privilege (PostgreSQL `42501`, MySQL 1142 and
    /// kin): `target` is `host:port/database`, `why` the server's message.
    #[error("{target}: permission denied: {why} (grant this user SELECT, INSERT, UPDATE and DELETE on the store's tables; `redcron check --sql` lists them)")]
    PermissionDenied { target: String, why: String },
}

impl StoreFault {
    /// The `reason` field of the log lines and history entries it causes.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreFault::FileReplaced { .. } => "file_replaced",
            StoreFault::PermissionDenied { .. } => "permission_denied",
        }
    }
}

/// Why a round did not reach a majority of the configured nodes.
///
/// A round is decided as soon as its outcome is known, so it may end before some nodes answered: those are
/// `unheard`, not failed — a split vote among live contenders ends that way, and blaming a live node for
/// it would send an operator to look at the wrong thing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no quorum: {granted} of {configured} nodes agreed, {needed} needed; {}", self.describe_nodes())]
pub struct QuorumFailure {
    pub configured: usize,
    pub needed: usize,
    pub granted: usize,
    /// `(node address without password, what went wrong)` for each node that failed.
    pub failures: Vec<(String, String)>,
    /// The nodes (addresses without password) whose answer had not come when the round was decided.
    pub unheard: Vec<String>,
    /// `(node, what it said)` for each node that answered but refused the claim — the tick already
    /// claimed there, the job held — with too few of them to decide the outcome: those nodes are up,
    /// and most often another worker won the tick on them. Filled by the Redis store, whose nodes vote
    /// one by one; the other stores answer as one authority, so a refusal there is the outcome itself.
    pub refused: Vec<(String, String)>,
}

impl QuorumFailure {
    fn describe_nodes(&self) -> String {
        let failed = if self.failures.is_empty() {
            "failed: none".to_string()
        } else {
            let parts: Vec<String> = self
                .failures
                .iter()
                .map(|(node, why)| format!("{node} ({why})"))
                .collect();
            format!("failed: {}", parts.join(", "))
        };
        let mut text = failed;
        if !self.refused.is_empty() {
            let parts: Vec<String> = self
                .refused
                .iter()
                .map(|(node, said)| format!("{node} ({said})"))
                .collect();
            text = format!("{text}; refused: {}", parts.join(", "));
        }
        if !self.unheard.is_empty() {
            text = format!(
                "{text}; decided before {} answered",
                self.unheard.join(", ")
            );
        }
        text
    }
}

/// A granted lease on `(job, tick)`.
///
/// The lease is valid until [`Lease::deadline`], a point on this host's boot clock (`CLOCK_BOOTTIME`, which
/// counts a suspend) that already accounts for the time the acquisition took and for clock drift. Once that deadline passes without a
/// successful renewal the lease is lost for good: [`crate::store::Store::renew`] never revives it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub job: String,
    pub tick: Tick,
    pub overlap: Overlap,
    /// The series of the claim this lease was granted for.
    pub series: Series,
    /// The fencing token of this run.
    pub token: FencingToken,
    /// The value stored on each node ([`keys`]): unique per attempt, so that renew and release only ever
    /// touch this lease.
    pub value: String,
    deadline: BootInstant,
    lost: bool,
}

impl Lease {
    pub(crate) fn new(
        request: &ClaimRequest,
        token: FencingToken,
        value: String,
        deadline: BootInstant,
    ) -> Lease {
        Lease {
            job: request.job.clone(),
            tick: request.tick,
            overlap: request.overlap,
            series: request.series.clone(),
            token,
            value,
            deadline,
            lost: false,
        }
    }

    /// The instant (boot clock) until which this lease is known to be held by a majority.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// What remains of the validity now; zero once the lease is lost or expired.
    pub fn remaining(&self) -> Duration {
        if self.lost {
            return Duration::ZERO;
        }
        self.deadline.remaining()
    }

    /// Whether the lease is still valid: not marked lost and its deadline not yet passed.
    pub fn is_valid(&self) -> bool {
        !self.lost && BootInstant::now() < self.deadline
    }

    /// Extends the deadline after a successful renewal. Never called on a lost lease.
    pub(crate) fn extend_to(&mut self, deadline: BootInstant) {
        debug_assert!(!self.lost);
        self.deadline = deadline;
    }

    /// Whether the lease was marked lost (a renewal failed for good); a lost lease is never renewed.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Marks the lease lost for good.
    pub(crate) fn mark_lost(&mut self) {
        self.lost = true;
    }

    /// The start of a renewal (now, on the boot clock), or why there is nothing to renew: the lease was
    /// lost, or its deadline has passed (then it is marked lost). Every store's renewal begins here.
    pub(crate) fn start_renewal(&mut self) -> Result<BootInstant, RenewError> {
        if self.lost {
            return Err(RenewError::AlreadyLost);
        }
        let start = BootInstant::now();
        if start >= self.deadline {
            self.lost = true;
            return Err(RenewError::Expired);
        }
        Ok(start)
    }
}

/// Why a renewal failed.
///
/// After every variant but [`RenewError::Unconfirmed`] the lease is lost and stays lost
/// ([`RenewError::is_lost`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// Too few nodes answered (timeouts, errors) to confirm the renewal, but none denied it and the
    /// deadline has not passed: the lease stays valid until [`Lease::deadline`], and renewing again soon
    /// may still succeed.
    #[error("renewal not confirmed by a majority yet: {0}")]
    Unconfirmed(QuorumFailure),
    /// The validity deadline had passed before a quorum confirmed the renewal.
    #[error("lease expired before a quorum renewed it")]
    Expired,
    /// The lease was already lost by an earlier failure; a lost lease is never renewed.
    #[error("lease was already lost")]
    AlreadyLost,
    /// Not enough nodes still held this lease's value (another holder took over, or the keys expired).
    #[error("lease no longer held on a majority: {0}")]
    NotHeld(QuorumFailure),
}

impl RenewError {
    /// Whether the lease is lost for good after this error (every variant but `Unconfirmed`).
    pub fn is_lost(&self) -> bool {
        !matches!(self, RenewError::Unconfirmed(_))
    }
}

#[cfg(test)]
mod tests {
    use super::ClaimOutcome;

    #[test]
    fn a_claim_left_without_an_outcome_is_retried_never_skipped() {
        let outcome = ClaimOutcome::unanswered(5);
        assert_eq!(outcome.retry_in(), Some(std::time::Duration::ZERO));
        let ClaimOutcome::NoQuorum(failure) = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(
            (failure.configured, failure.needed, failure.granted),
            (5, 3, 0)
        );
    }
}
