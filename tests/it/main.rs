//! redcron's integration tests: one binary, a module per area, real `redis-server` nodes, real etcd
//! clusters and real worker processes started by [`support`].

mod alerts;
mod bench_smoke;
mod chaos;
mod claims;
mod cli;
mod clock;
mod config;
mod deploy;
mod docs;
mod embedded;
mod etcd;
mod etcd_failover;
mod etcd_in_flight;
mod etcd_pause;
mod etcd_series;
mod herd;
mod history;
mod inspect;
mod job_env;
mod lease_stop;
mod lock;
mod metrics;
mod model;
mod old_workers;
mod order;
mod pause;
mod reload;
mod retries;
mod schedule;
mod store_garbage;
mod support;
mod trigger;
mod trigger_clock;
mod worker;
