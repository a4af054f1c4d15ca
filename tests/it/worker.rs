//! Tests: worker
