//! Clocks: the boot clock that leases are measured on ([`boot`]), and cluster time, the wall clock that
//! ticks are scheduled on, corrected by this host's measured offset to the Redis nodes' clocks
//! ([`cluster`]).

use std::time::Duration;

mod alarm;
pub mod boot;
pub mod cluster;

/// A duration as an operator writes it (`3s 333ms`), to the millisecond.
pub fn show_duration(duration: Duration) -> String {
    let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(millis)).to_string()
}
