//! Tests: lock
