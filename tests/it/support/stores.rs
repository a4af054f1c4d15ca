//! What the store tests share beyond the harness: claiming as the worker claims ([`claim_until_final`]),
//! and [`on_every_store!`], which runs a worker-level test on Redis and on etcd.
//!
//! The stores themselves — [`Backend`](testkit::Backend), its [`Cluster`](testkit::Cluster) and a redcron
//! store on it — are the `testkit` harness's, shared with the benchmark; the store-level guarantees every
//! store keeps are one suite, `tests/it/conformance`.

use std::time::Duration;

use redcron::lock::{ClaimOutcome, ClaimRequest, Lease};
use redcron::store::Store;

/// The lease of a won claim; panics on any other outcome.
pub fn won(outcome: ClaimOutcome) -> Lease {
    match outcome {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// How long a test gives a claim to become final ([`claim_won`]): no quorum within a 50 ms `node_timeout`
/// on a loaded machine, a contender between its rounds, an etcd election (0.5–1 s) plus reconnects.
pub const SETTLE: Duration = Duration::from_secs(20);

/// Claims `request` as the worker does: the same request again while the outcome is not final, after the
/// delay the outcome asks for, for at most `patience`.
pub async fn claim_until_final(
    store: &Store,
    request: &ClaimRequest,
    patience: Duration,
) -> ClaimOutcome {
    let give_up = tokio::time::Instant::now() + patience;
    loop {
        let outcome = store.claim(request).await;
        match outcome.retry_in() {
            Some(wait) if tokio::time::Instant::now() + wait < give_up => {
                tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
            }
            _ => return outcome,
        }
    }
}

/// The lease of `request`, claimed as the worker does ([`claim_until_final`] for [`SETTLE`]); panics on
/// any other final outcome.
pub async fn claim_won(store: &Store, request: &ClaimRequest) -> Lease {
    won(claim_until_final(store, request, SETTLE).await)
}

/// Instantiates tests once per shared store: `async` ones as multi-threaded Tokio tests, `sync` ones as
/// plain tests; each named function takes a [`Backend`].
#[macro_export]
macro_rules! on_every_store {
    (async: [$($async_test:ident),* $(,)?], sync: [$($sync_test:ident),* $(,)?] $(,)?) => {
        /// The suite on 5 Redis nodes.
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $async_test() {
                    super::$async_test($crate::support::Backend::Redis).await
                }
            )*
            $(
                #[test]
                fn $sync_test() {
                    super::$sync_test($crate::support::Backend::Redis)
                }
            )*
        }
        /// The suite on a 3-member etcd cluster.
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $async_test() {
                    super::$async_test($crate::support::Backend::Etcd).await
                }
            )*
            $(
                #[test]
                fn $sync_test() {
                    super::$sync_test($crate::support::Backend::Etcd)
                }
            )*
        }
        /// The suite on a PostgreSQL server (the SQL store's code is one for both servers; MariaDB runs the
        /// conformance suite, the fault tests and its chaos run).
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $async_test() {
                    super::$async_test($crate::support::Backend::Postgres).await
                }
            )*
            $(
                #[test]
                fn $sync_test() {
                    super::$sync_test($crate::support::Backend::Postgres)
                }
            )*
        }
    };
}
