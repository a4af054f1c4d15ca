//! TODO: cli
