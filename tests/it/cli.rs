//! Tests: cli
