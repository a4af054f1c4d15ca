//! TODO: worker
