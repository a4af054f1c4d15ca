//! Clocks: the boot clock that leases are measured on ([`boot`]), and cluster time, the wall clock that
//! ticks are scheduled on, corrected by this host's measured offset to the Redis nodes' clocks
//! ([`cluster`]).

mod alarm;
pub mod boot;
pub mod cluster;
