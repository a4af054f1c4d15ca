//! Clocks: the boot clock that leases are measured on ([`boot`]).

pub mod boot;
