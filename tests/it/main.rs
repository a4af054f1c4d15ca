//! redcron's integration tests: one binary, a module per area, real `redis-server` nodes, real etcd
//! clusters and real worker processes started by [`support`].

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
mod etcd_pause;
mod etcd_series;
mod herd;
mod history;
mod inspect;
mod job_env;
mod lease_stop;
mod listener;
mod lock;
mod metrics;
mod model;
mod order;
mod pause;
mod reload;
mod retries;
mod schedule;
mod support;
mod trigger;
mod worker;
mod yaml_limits;
