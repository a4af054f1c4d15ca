//! The name of every event the worker and the CLI log (their `event` field), in one place.
//!
//! The names are public: operators filter the logs on them (`select(.event == "run.finished")`) and build
//! alerts on them, the integration tests look events up by them, and `docs/logs.md`'s table documents
//! each. A name is `<area>.<fact>` and its constant `events::<area>::<FACT>`, so that
//! `info!(event = events::run::STARTED, …)` logs `run.started`; the tests below hold this module, that rule
//! and that table to one another, both ways.

/// Declares each area's module of constants and, for the tests, the list of them all (so that a constant
/// cannot be left out of the checks).
macro_rules! events {
    ($($(#[$area_doc:meta])* $area:ident { $($(#[$doc:meta])* $name:ident = $value:literal;)* })*) => {
        $(
            $(#[$area_doc])*
            pub(crate) mod $area {
                $($(#[$doc])* pub(crate) const $name: &str = $value;)*
            }
        )*

        /// Every event: its area, its constant's name and the name it logs.
        #[cfg(test)]
        const ALL: &[(&str, &str, &str)] = &[$($((stringify!($area), stringify!($name), $area::$name),)*)*];
    };
}

events! {
    /// The worker's life: start, stop, its store, heartbeats, listener and tasks.
    worker {
        /// The worker is up (with its settings and limits).
        STARTED = "worker.started";
        /// WARN at start: no shared store, so ticks are claimed in this host's database file (and every host
        /// that runs the file runs every job).
        EMBEDDED_STORE = "worker.embedded_store";
        /// WARN at start: a process setting of the worker (`not_dumpable`, `child_subreaper`) failed.
        SETTING_FAILED = "worker.setting_failed";
        /// WARN, once per stretch: the worker's announcement did not reach a majority.
        HEARTBEAT_FAILED = "worker.heartbeat_failed";
        /// Announcements reach a majority again after `HEARTBEAT_FAILED`.
        HEARTBEAT_RECOVERED = "worker.heartbeat_recovered";
        /// WARN, once per other process: another live process announces itself under this worker's id.
        ID_SHARED = "worker.id_shared";
        /// The metrics and health listener (`worker.listen`) is up.
        LISTENING = "worker.listening";
        /// WARN, once per stretch: the listener cannot accept connections (out of descriptors).
        LISTENER_ACCEPT_FAILED = "worker.listener_accept_failed";
        /// WARN: the listener stopped; the worker goes on without it.
        LISTENER_FAILED = "worker.listener_failed";
        /// ERROR: a task of the worker panicked (a bug); a background task is started again.
        TASK_PANICKED = "worker.task_panicked";
        /// The first SIGINT/SIGTERM: the worker stops racing and lets running jobs finish.
        STOPPING = "worker.stopping";
        /// Everything ended and the leases are released.
        STOPPED = "worker.stopped";
        /// ERROR: the worker could not set up its store or its listener, or stopped on an error; exit 1.
        FAILED = "worker.failed";
    }

    /// The clock: the offset to the store's clocks, and the boot-clock timer.
    clock {
        /// WARN at start: the boot-clock timer could not be made; lease deadlines are checked every second.
        ALARM_UNAVAILABLE = "clock.alarm_unavailable";
        /// The offset to the store's clocks was measured (at start, after failures, on a move, hourly).
        OFFSET = "clock.offset";
        /// WARN: the offset is above `worker.max_clock_offset`.
        OFFSET_HIGH = "clock.offset_high";
        /// WARN, once per stretch of failures: fewer than a majority of the nodes told their time.
        UNMEASURED = "clock.unmeasured";
        /// Measuring works again after `UNMEASURED`.
        RECOVERED = "clock.recovered";
    }

    /// A tick's race: won, lost, skipped, retried, or missed by the whole cluster.
    tick {
        /// This worker claimed the tick.
        WON = "tick.won";
        /// Another worker has the tick (or a later one, or the job is busy).
        LOST = "tick.lost";
        /// The tick is not raced or not won by anyone here (the `reason` says why).
        SKIPPED = "tick.skipped";
        /// At start: a tick from before the worker started is raced (it is within the job's misfire grace).
        FROM_BEFORE_START = "tick.from_before_start";
        /// ERROR, once across the cluster: nobody ran the tick within its window.
        MISSED = "tick.missed";
        /// WARN at start: the job's history could not be read, so missed ticks are not reported.
        MISSED_CHECK_FAILED = "tick.missed_check_failed";
        /// The tick's outcome is not final yet; it is raced again with the same claim.
        RETRYING = "tick.retrying";
    }

    /// `redcron trigger` requests, as the worker reads them.
    trigger {
        /// This worker read a trigger request for a job it runs, and claims it.
        RECEIVED = "trigger.received";
        /// WARN, once per request: a request out of bounds is not claimed, and is deleted.
        REFUSED = "trigger.refused";
        /// WARN, once per stretch: the trigger requests could not be read from a majority.
        POLL_FAILED = "trigger.poll_failed";
    }

    /// What the store holds.
    store {
        /// WARN, once per entry and node: an entry redcron cannot have written is skipped.
        ENTRY_SKIPPED = "store.entry_skipped";
        /// WARN: nodes of the ZooKeeper store had another ACL than its user's and were given it.
        ACL_FIXED = "store.acl_fixed";
        /// ERROR, per connection: a Redis node's answers do not count (a replica, an evicting or Cluster
        /// server, or a second name of a server another node is).
        NODE_REFUSED = "store.node_refused";
        /// WARN: a Redis node's `run_id` changed (it restarted); it does not count for one TTL.
        NODE_RESTARTED = "store.node_restarted";
        /// WARN, once per server: a Redis node runs without `appendonly yes` and `appendfsync always`.
        NODE_UNSAFE = "store.node_unsafe";
        /// INFO: a Sentinel group's node follows its master to a promoted replica, or a Redis Cluster
        /// shard's slots are served by a new master (a failover).
        MASTER_SWITCHED = "store.master_switched";
        /// WARN: no node of a Redis Cluster gave its slot map (`CLUSTER SHARDS`).
        CLUSTER_MAP_FAILED = "store.cluster_map_failed";
        /// WARN, once per stretch: no Sentinel of a group named a reachable master.
        MASTER_UNKNOWN = "store.master_unknown";
    }

    /// A job as the cluster sees it.
    job {
        /// WARN, once per job, worker and definition: another worker runs another definition of the job.
        CONFIG_DIFFERS = "job.config_differs";
    }

    /// A run of a job: its child process, its output, its end and its retries.
    run {
        /// The child started.
        STARTED = "run.started";
        /// One line of the child's stdout or stderr.
        OUTPUT = "run.output";
        /// WARN: the child's output could not be read further.
        OUTPUT_ERROR = "run.output_error";
        /// WARN: after SIGKILL an escaped descendant still held the output pipes; reading stopped.
        OUTPUT_ABANDONED = "run.output_abandoned";
        /// The child exited and left processes running: they get SIGTERM, and SIGKILL after `stop_grace`.
        ENDING_REST = "run.ending_rest";
        /// The job's `timeout` passed; the child is being stopped.
        TIMEOUT = "run.timeout";
        /// SIGTERM goes to the child's process group; SIGKILL follows unless it exits.
        STOPPING = "run.stopping";
        /// Shutdown was requested while the job runs.
        DRAINING = "run.draining";
        /// The child ended (with its outcome).
        FINISHED = "run.finished";
        /// The run failed and the job has retries left: the next attempt is claimed after the backoff.
        RETRY_SCHEDULED = "run.retry_scheduled";
        /// WARN: the last attempt failed too.
        RETRIES_EXHAUSTED = "run.retries_exhausted";
    }

    /// A run's lease: renewals and their failure.
    lease {
        /// WARN: a renewal was not confirmed yet; retried until the deadline.
        RENEW_FAILED = "lease.renew_failed";
        /// ERROR: no renewal confirmed and only `stop_grace` is left; the child is being stopped.
        EXPIRING = "lease.expiring";
        /// ERROR: the lease is gone; the child is being stopped.
        LOST = "lease.lost";
        /// A renewal was confirmed while the child is being stopped; the stop goes on.
        RENEWED_WHILE_STOPPING = "lease.renewed_while_stopping";
    }

    /// The run history's writes.
    history {
        /// WARN: history entries were not taken by a majority yet; they are written again.
        WRITE_FAILED = "history.write_failed";
        /// WARN: history entries were dropped (too many waiting, or the worker stopped).
        DROPPED = "history.dropped";
    }

    /// The log itself.
    log {
        /// WARN: log lines were dropped because stdout did not take them in time (a stalled reader);
        /// written by the log's writer once lines flow again.
        DROPPED = "log.dropped";
    }

    /// The live workers.
    members {
        /// The live workers read back after a heartbeat changed.
        CHANGED = "members.changed";
    }

    /// The config file: its warnings and reloads.
    config {
        /// WARN, one per warning of the config file, at start and at each reload that reads it.
        WARNING = "config.warning";
        /// SIGHUP or a changed config file was applied.
        RELOADED = "config.reloaded";
        /// ERROR, one per problem: the new file was not applied.
        RELOAD_FAILED = "config.reload_failed";
        /// WARN: a reload changed settings that apply after a restart.
        RESTART_NEEDED = "config.restart_needed";
    }

    /// The web dashboard (`crate::dashboard`): logins, refusals and the controls used through it.
    dashboard {
        /// A token was accepted by `POST /login` (`operator`: the token's name).
        LOGIN = "dashboard.login";
        /// WARN: a wrong token was offered (login form or bearer header), answered after a delay.
        LOGIN_FAILED = "dashboard.login_failed";
        /// A control was used: `action` (pause, resume, trigger), `job`, `operator`, `from` (the peer's
        /// address), `reason`, and what came of it (`result`).
        CONTROL = "dashboard.control";
        /// WARN: a pause or resume made through the dashboard is done, but its `control` entry did not
        /// reach the history: `action`, `job`, `operator`, `error`.
        CONTROL_NOT_RECORDED = "dashboard.control_not_recorded";
    }

    /// The alert hook.
    alert {
        /// An alert hook ran and exited 0.
        SENT = "alert.sent";
        /// WARN: the hook could not start, exited non-zero, or ran too long.
        FAILED = "alert.failed";
        /// WARN: the earlier runs could not be read, so the alert cannot count failures in a row.
        HISTORY_UNAVAILABLE = "alert.history_unavailable";
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::ALL;

    /// `docs/logs.md`, whose table documents every event.
    const LOGS: &str = include_str!("../../docs/logs.md");

    /// The events in the first column of `docs/logs.md`'s tables.
    fn documented() -> BTreeSet<&'static str> {
        LOGS.lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|cell| cell.split_once('`'))
            .map(|(name, _)| name)
            .collect()
    }

    /// Each constant logs `<area>.<fact>` for its module `<area>` and its name `<FACT>`: the rule by which
    /// a name is found in the code, and by which the call sites were rewritten to the constants.
    #[test]
    fn every_event_is_named_after_its_area_and_constant() {
        for (area, constant, name) in ALL {
            assert_eq!(*name, format!("{area}.{}", constant.to_lowercase()));
        }
        let names: BTreeSet<&str> = ALL.iter().map(|(_, _, name)| *name).collect();
        assert_eq!(names.len(), ALL.len(), "an event name is declared twice");
    }

    /// `docs/logs.md`'s events table and this module list the same events: none logged undocumented, none
    /// documented that is not logged.
    #[test]
    fn the_readme_documents_every_event_and_no_other() {
        let documented = documented();
        let logged: BTreeSet<&str> = ALL.iter().map(|(_, _, name)| *name).collect();
        let undocumented: Vec<_> = logged.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&logged).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "events not in docs/logs.md's table: {undocumented:?}; \
             in the table but not in src/logging/events.rs: {unknown:?}"
        );
    }
}
