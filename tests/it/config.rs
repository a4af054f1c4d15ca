//! Tests: config
