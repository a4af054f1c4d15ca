//! TODO: logging
