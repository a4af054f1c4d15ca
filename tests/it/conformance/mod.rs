//! The conformance suite: the guarantees every store keeps, proved through [`redcron::store::Store`] alone
//! on each store — 5 Redis nodes, a 3-member etcd cluster, the embedded store's SQLite file, a PostgreSQL
//! server, a MariaDB server, a 3-member ZooKeeper ensemble, the Redis store on one Sentinel group (a
//! master, a replica and a Sentinel: every answer waits for the replica's `WAIT`), and on a Redis
//! Cluster of 3 masters with a replica each (every master's answer waits for its replica's `WAIT`).
//!
//! [`conformance!`] instantiates the whole suite once per store, as `conformance::<store>::<test>`, so that
//! one store's run is one filter (`cargo test --test it conformance::embedded`); a store's own faults (a
//! node down or hung, no majority) and the tests that hold for some stores only are listed on its line (as
//! `auth`, on every store that has credentials: all but the embedded one). A
//! new store is one more line at the end of this file (and a variant of `testkit::Backend`).
//!
//! Each test starts its own cluster and uses jobs of its own ([`Backend::start_shared`]: on ZooKeeper the
//! process's one ensemble under a chroot of the test's own, as good as its own and without three JVMs to
//! start per test); a test that stops or kills nodes starts its own ([`Backend::start`]). What differs between
//! the stores (etcd's whole-second leases, the embedded store's fsync'd commits) is answered by the
//! harness ([`Backend::adapt`], [`Backend::expiry`]), so each test says the same for every store.
//!
//! `reads` holds on the stores whose reads share a process's connections with its lock path (the
//! embedded store, PostgreSQL, MariaDB): a worker whose dashboard is hammered keeps its leases and ticks.

mod auth;
mod claims;
mod faults;
mod leases;
mod pauses;
mod reads;
mod records;
mod triggers;

use std::time::Duration;

use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap};
use redcron::schedule::Tick;
use redcron::store::Store;

#[allow(unused_imports)]
use crate::support::Backend;

/// Lock settings for the suite: a TTL of `ttl_ms` (adapted to each store by the harness), a short node
/// timeout and retry delay.
pub(crate) fn settings(ttl_ms: u64) -> LockSettings {
    LockSettings {
        ttl: Duration::from_millis(ttl_ms),
        renew_every: Duration::from_millis(ttl_ms / 3),
        node_timeout: Duration::from_millis(50),
        retry_delay: Duration::from_millis(30),
        ..LockSettings::default()
    }
}

/// Settings for races of many contenders in one process: each round carries hundreds of requests per
/// node, so a loaded machine needs more than 50 ms per node to answer them all.
pub(crate) fn race_settings() -> LockSettings {
    LockSettings {
        node_timeout: Duration::from_millis(400),
        retries: 5,
        ..settings(5_000)
    }
}

/// A new claimant of `(job, tick)` for `worker`, with `overlap: skip`.
pub(crate) fn request(worker: &str, job: &str, tick: i64) -> ClaimRequest {
    ClaimRequest::new(worker, job, Tick(tick), Overlap::Skip, "test")
}

/// Waits until every node of a fresh store answers, so that the first claim does not race the connects.
pub(crate) async fn warm(store: &Store) {
    let _ = store.claim(&request("warm-up", "warm-up", 1)).await;
}

/// The outcome of `request` once final: a `NoQuorum` or `Contended` answer (a node slow on a loaded
/// machine) is retried with the same claimant, as the worker does, so the test sees what the tick is.
pub(crate) async fn settled(store: &Store, request: &ClaimRequest) -> ClaimOutcome {
    crate::support::claim_until_final(store, request, Duration::from_secs(10)).await
}

/// Claims tick `tick` of `job` for `worker` until the outcome is final (a failover in progress is
/// `NoQuorum`, retried), and returns the lease's token; the lease is released.
pub(crate) async fn token_of(store: &Store, worker: &str, job: &str, tick: i64) -> u64 {
    let lease = crate::support::won(settled(store, &request(worker, job, tick)).await);
    let token = lease.token;
    store.release(&lease).await;
    token
}

/// Every tick in `ticks` is refused to a new claimant: the records survived.
pub(crate) async fn all_still_claimed(
    store: &Store,
    job: &str,
    ticks: impl IntoIterator<Item = i64>,
) {
    for tick in ticks {
        let outcome = settled(store, &request("latecomer", job, tick)).await;
        assert!(
            matches!(outcome, ClaimOutcome::AlreadyClaimed { .. }),
            "tick {tick} of {job} was claimable again after a failover: {outcome:?}"
        );
    }
}

/// Instantiates the suite for one store: `conformance!(<module>, <Backend>, extra: [<tests>])` makes
/// module `<module>` with every test of the suite on `<Backend>`, and the `extra` tests (the store's
/// faults, and the tests that hold for some stores only) after them. Every test is a function of this
/// module's submodules that takes a [`Backend`]: `async` ones run as multi-threaded Tokio tests.
macro_rules! conformance {
    ($store:ident, $backend:expr, extra: [$($module:ident :: $extra:ident),* $(,)?] $(,)?) => {
        #[doc = concat!("The conformance suite on `", stringify!($backend), "`.")]
        mod $store {
            use super::*;

            conformance!(@async $backend,
                claims::acquire_renew_release,
                claims::two_hundred_contenders_one_winner,
                claims::successive_leases_have_strictly_increasing_tokens,
                claims::a_claimed_tick_is_never_granted_again,
                claims::workers_that_disagree_on_overlap_claim_a_tick_once,
                claims::series_have_their_own_claims_and_share_lease_and_fence,
                leases::expired_holder_cannot_renew_or_release_the_next_holder,
                leases::renewal_keeps_a_lease_past_its_ttl,
                leases::renewal_after_the_deadline_never_revives,
                pauses::a_paused_job_is_refused_in_every_series_until_resumed,
                pauses::a_pause_for_a_while_ends_by_itself,
                pauses::a_shorter_pause_keeps_the_longer_in_force_unless_replaced,
                pauses::a_pause_racing_a_claim_in_flight_is_linearizable,
                triggers::trigger_requests_are_written_read_and_forgotten,
                records::the_store_keeps_the_newest_ticks_newest_first,
                records::members_are_alive_until_they_stop_or_expire,
                records::a_second_skip_of_a_tick_replaces_the_first,
                records::the_bound_holds_with_its_slack,
                records::old_format_entries_are_still_read,
                records::two_controls_of_one_millisecond_are_both_kept,
                faults::no_majority_grants_nothing_and_the_store_recovers,
                records::entries_at_the_largest_output_tails_are_written_and_read_whole,
                reads::reads_of_a_large_history_never_delay_claims_or_renewals,
                $($module::$extra,)*
            );

            #[test]
            fn contenders_in_three_processes_one_winner() {
                claims::contenders_in_three_processes_one_winner($backend)
            }
        }
    };
    (@async $backend:expr, $($module:ident :: $test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                $module::$test($backend).await
            }
        )*
    };
}

conformance!(redis, Backend::Redis, extra: [
    auth::a_client_without_credentials_changes_nothing,
    claims::a_tick_far_ahead_of_the_clock_is_refused,
    claims::tokens_are_exact_to_their_bound_and_refused_past_it,
    faults::a_minority_down_still_claims_and_a_majority_down_is_no_quorum,
    faults::a_hung_minority_costs_one_node_timeout,
]);
conformance!(etcd, Backend::Etcd, extra: [
    auth::a_client_without_credentials_changes_nothing,
    faults::a_member_killed_and_restarted_costs_no_grant,
    faults::a_hung_leader_costs_an_election_not_a_grant,
]);
conformance!(embedded, Backend::Embedded, extra: [
    claims::a_tick_far_ahead_of_the_clock_is_refused,
    claims::tokens_are_exact_to_their_bound_and_refused_past_it,
]);
conformance!(postgres, Backend::Postgres, extra: [
    auth::a_client_without_credentials_changes_nothing,
    claims::a_tick_far_ahead_of_the_clock_is_refused,
    claims::tokens_are_exact_to_their_bound_and_refused_past_it,
]);
conformance!(mariadb, Backend::Mariadb, extra: [
    auth::a_client_without_credentials_changes_nothing,
    claims::a_tick_far_ahead_of_the_clock_is_refused,
    claims::tokens_are_exact_to_their_bound_and_refused_past_it,
]);
conformance!(zookeeper, Backend::Zookeeper, extra: [
    auth::a_client_without_credentials_changes_nothing,
]);
conformance!(redis_sentinel, Backend::RedisSentinel, extra: [
    auth::a_client_without_credentials_changes_nothing,
    claims::a_tick_far_ahead_of_the_clock_is_refused,
    claims::tokens_are_exact_to_their_bound_and_refused_past_it,
]);
conformance!(redis_cluster, Backend::RedisCluster, extra: [
    auth::a_client_without_credentials_changes_nothing,
    claims::a_tick_far_ahead_of_the_clock_is_refused,
    claims::tokens_are_exact_to_their_bound_and_refused_past_it,
]);
