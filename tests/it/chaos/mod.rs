//! Chaos: exactly once under faults (being written).
