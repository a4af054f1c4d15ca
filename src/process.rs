//! TODO: process
