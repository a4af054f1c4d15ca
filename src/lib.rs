//! redcron: a cluster cron in which each (job, tick) runs exactly once.
//!
//! Identical worker processes read the same schedule. At every tick of a job they race for that job's
//! lease in one shared store — a Redlock held on a majority of independent Redis nodes, a transaction in
//! an etcd cluster, in PostgreSQL or MySQL/MariaDB, or in a ZooKeeper ensemble, or, for the workers of
//! one host, an embedded SQLite file — and the winner runs the
//! job as a child process, renewing the lease while it runs and handing the job a fencing token that
//! strictly increases from run to run.
//!
//! # Layout
//! Lowest layer first: each module uses only those above it in this list, never one below
//! (`layers::the_top_level_modules_use_each_other_without_a_cycle` holds them to no cycle).
//! - [`schedule`]: cron expressions (via `croner`), time zones, the DST rule, and [`schedule::Tick`], the
//!   cluster-wide identity of one scheduled instant.
//! - [`clock`]: the boot clock that leases are measured on (it counts a host's suspend), and cluster
//!   time, which ticks are scheduled on (this host's clock, corrected on Redis by its offset to the nodes').
//! - [`logging`]: JSON (or text) log events with stable names and top-level fields.
//! - [`shutdown`]: the two-stage shutdown signal (graceful, then immediate) that every task watches.
//! - [`lock`]: what a claim asks and answers — leases, tick claims and their series, pauses, fencing
//!   tokens, and the names the protocol writes.
//! - [`membership`]: the workers' announcements and heartbeats.
//! - [`history`]: each worker's account of each tick (who ran it, how it ended, or why not), and its merge.
//! - [`control`]: the worker's one control channel: reload, drain, stop (signals and the config file's
//!   watcher send to it).
//! - [`metrics`]: the worker's Prometheus metrics, one named function per fact; served with `/healthz`
//!   and `/readyz` by the worker's optional HTTP listener (`worker.listen`).
//! - [`config`]: `jobs.yaml`, parsed in two stages (serde form, then a validated form) with errors that
//!   name the file, line, column and field; its one store section is a [`config::StoreConfig`].
//! - [`trigger`]: `redcron trigger`'s requests for one extra run now, which the workers claim through the
//!   lock.
//! - [`process`]: the job's child process: spawn, stream its output into the log, stop it (SIGTERM, then
//!   SIGKILL after a grace).
//! - [`store`]: the one seam to where state lives — the Redlock protocol on N Redis nodes, transactions
//!   in an etcd cluster or a PostgreSQL or MySQL/MariaDB database, a ZooKeeper ensemble, or the embedded
//!   single-host store (a SQLite file) — for claims, leases, history, membership, pauses and triggers;
//!   its contract is a set of traits ([`store::capability`]) that every store implements.
//! - [`inspect`]: what `status`, `history` and `explain` know, computed once as plain data from the store's
//!   reads (pure and unit-tested), for the command line — or a web page — to render as text or JSON.
//! - [`dashboard`]: the web dashboard every worker serves on `worker.listen`: the jobs, their ticks, the
//!   workers, from the same model as the CLI, with token auth and, when allowed, pause/resume/trigger.
//! - [`worker`]: the daemon: sleep until each tick, race, run the winner's job under a lease watchdog, and
//!   shut down gracefully.
//! - [`cli`]: the command line (`run`, `check`, `next`; `status`, `history`, `explain`, which read the
//!   store; `pause` and `resume`, which act through the lock).

pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod dashboard;
pub mod history;
pub mod inspect;
pub mod lock;
pub mod logging;
pub mod membership;
pub mod metrics;
pub mod process;
pub mod schedule;
pub mod shutdown;
pub mod store;
pub mod trigger;
pub mod worker;
