//! Counting a round's answers against the configured nodes.
