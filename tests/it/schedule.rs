//! Tests: schedule
