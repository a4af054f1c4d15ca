//! The lease keeper: renewals and releases of many runs travel together, one pipeline per node.
//!
//! Each run renews and releases its own lease, but a worker runs many at once, and a herd runs thousands:
//! sent one by one, 6,000 renewals due together were 30,000 requests queued behind the claims at the
//! nodes, each with its own `node_timeout`, and most timed out (`lease.renew_failed`, then runs stopped as
//! `lease_lost`). The keeper takes every renewal (and every release) asked for and sends it at once,
//! together with all the others asked for meanwhile, in one pipeline per node (one script call per node
//! for up to [`super::scripts::CLAIMS_PER_CALL`] leases): one round for the lot, each lease decided by its
//! own tally. A request that finds a free place goes out at once, so a lone renewal
//! waits for nothing; while every place is taken ([`RENEWALS`], [`RELEASES`]), new requests gather into
//! the next batch.
//!
//! Nothing about a lease changes: each renewal still starts its stopwatch before its pipeline is sent, is
//! granted only by a majority before the lease's deadline, and never revives a lost lease
//! ([`RedisStore::renew_each`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::RedisStore;
use crate::lock::{Lease, RenewError};

/// Renewal batches on their way at once, and the most leases in one: small enough that a node runs a
/// batch in a millisecond or two, so a renewal still takes at most `node_timeout` (the watchdog's slack
/// counts on that), and many at once, so a herd's renewals do not queue long behind each other. A renewal
/// waits for no others.
const RENEWALS: Limits = Limits {
    in_flight: 16,
    batch: 100,
    gather: Duration::ZERO,
};
/// Release batches on their way at once, and the most leases in one. A *patient* release (a run's end,
/// [`crate::store::Store::release_soon`]) waits up to [`RELEASE_GATHER`] for others: the runs of one tick
/// that end within a few milliseconds of each other (short jobs) then share one script call per node
/// (`RELEASE` takes a batch) instead of one each — a third of a short run's commands on the nodes — and
/// the lease is held that much longer, far less than any tick apart. Any other release goes at once (with
/// whatever waits with it), so a caller that waits on its unlock (the lease API) never pays the gathering.
const RELEASES: Limits = Limits {
    in_flight: 4,
    batch: 1_000,
    gather: RELEASE_GATHER,
};
/// How long a release waits for others to go with it.
const RELEASE_GATHER: Duration = Duration::from_millis(10);

/// How a kind of request is batched.
#[derive(Debug, Clone, Copy)]
struct Limits {
    in_flight: usize,
    batch: usize,
    /// How long a batch of patient requests waits from its first request for more; a request that is not
    /// patient ends the wait.
    gather: Duration,
}

/// A renewal asked for: the lease, and where its outcome goes.
type Renewal = (Lease, oneshot::Sender<(Lease, Result<(), RenewError>)>);
/// A release asked for: the lease, who waits until a majority has answered, and whether it may wait for
/// others ([`RELEASES`]).
type Release = (Lease, oneshot::Sender<()>, bool);

/// The channels to the keeper's two tasks; they end when the store is dropped.
#[derive(Debug)]
pub(super) struct Keeper {
    renewals: mpsc::UnboundedSender<Renewal>,
    releases: mpsc::UnboundedSender<Release>,
}

impl Keeper {
    /// Starts the tasks that renew and release through `store` (a copy without a keeper of its own).
    pub(super) fn start(store: RedisStore) -> Keeper {
        let store = Arc::new(store);
        let (renewals, renewal_queue) = mpsc::unbounded_channel::<Renewal>();
        let (releases, release_queue) = mpsc::unbounded_channel::<Release>();
        let renewing = Arc::clone(&store);
        tokio::spawn(coalesce(
            renewal_queue,
            RENEWALS,
            |_| false,
            move |batch: Vec<Renewal>| {
                let store = Arc::clone(&renewing);
                async move {
                    let (leases, replies): (Vec<Lease>, Vec<_>) = batch.into_iter().unzip();
                    let outcomes = store.renew_each(leases).await;
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        // The run that asked may have ended meanwhile.
                        let _ = reply.send(outcome);
                    }
                }
            },
        ));
        tokio::spawn(coalesce(
            release_queue,
            RELEASES,
            |release: &Release| release.2,
            move |batch: Vec<Release>| {
                let store = Arc::clone(&store);
                async move {
                    let (leases, replies): (Vec<Lease>, Vec<_>) = batch
                        .into_iter()
                        .map(|(lease, reply, _)| (lease, reply))
                        .unzip();
                    store.release_each(&leases).await;
                    for reply in replies {
                        let _ = reply.send(());
                    }
                }
            },
        ));
        Keeper { renewals, releases }
    }

    /// Renews `lease` in the next batch; `None` if the keeper is gone (the store is being dropped).
    pub(super) async fn renew(&self, lease: &Lease) -> Option<(Lease, Result<(), RenewError>)> {
        let (reply, outcome) = oneshot::channel();
        self.renewals.send((lease.clone(), reply)).ok()?;
        outcome.await.ok()
    }

    /// Releases `lease` in the next batch — `patient`: after waiting a little for others to go with it —;
    /// returns once a majority has answered (or the batch's budget passed); `false` if the keeper is gone.
    pub(super) async fn release(&self, lease: &Lease, patient: bool) -> bool {
        let (reply, done) = oneshot::channel();
        if self.releases.send((lease.clone(), reply, patient)).is_err() {
            return false;
        }
        done.await.is_ok()
    }
}

/// Takes requests from `queue` in batches — whatever has gathered when a batch may start, up to
/// `limits.batch`, and while every request of the batch is `patient`, what comes within `limits.gather`
/// — and runs each batch with `run`, at most `limits.in_flight` at once.
async fn coalesce<T, F, W>(
    mut queue: mpsc::UnboundedReceiver<T>,
    limits: Limits,
    patient: fn(&T) -> bool,
    run: F,
) where
    T: Send + 'static,
    F: Fn(Vec<T>) -> W,
    W: Future<Output = ()> + Send + 'static,
{
    let in_flight = Arc::new(Semaphore::new(limits.in_flight));
    while let Some(first) = queue.recv().await {
        // The semaphore is never closed.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let mut waits = patient(&first);
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + limits.gather;
        while batch.len() < limits.batch {
            match queue.try_recv() {
                Ok(request) => {
                    waits &= patient(&request);
                    batch.push(request);
                }
                Err(_) if !waits || limits.gather.is_zero() => break,
                Err(_) => match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(request)) => {
                        waits &= patient(&request);
                        batch.push(request);
                    }
                    Ok(None) | Err(_) => break,
                },
            }
        }
        let work = run(batch);
        tokio::spawn(async move {
            work.await;
            drop(permit);
        });
    }
}
