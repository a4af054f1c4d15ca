//! `jobs.yaml`: the schedule and settings every worker reads.
//!
//! Parsed in two stages, as ripgrep does with its flags: a serde form close to the file (unknown fields
//! rejected), then a validated [`Config`] with cross-field checks. Every error names the file, the line
//! and column, and the field.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::lock::{LockSettings, Overlap};
use crate::schedule::Schedule;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    /// Redis nodes; `None` means the embedded single-host store.
    pub redis: Option<RedisConfig>,
    /// Lease parameters (`lock:` plus `redis.key_prefix`).
    pub lock: LockSettings,
    pub worker: WorkerConfig,
    pub jobs: Vec<JobConfig>,
    /// Problems that do not stop the worker but that an operator should see (e.g. an even node count).
    pub warnings: Vec<String>,
}

/// The Redis nodes of the lock.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// `redis://` or `rediss://` URLs, as written (after `${VAR}` substitution); may hold passwords, so
    /// display them only through [`crate::lock::node::redact`].
    pub nodes: Vec<String>,
}

/// Settings of this worker process.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// This worker's id in logs and lease values (default `<hostname>-<pid>-<short random>`).
    pub id: String,
    /// How long running jobs may go on after a graceful shutdown was requested.
    pub shutdown_grace: Duration,
}

/// One job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub name: String,
    pub schedule: Schedule,
    pub command: Command,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<PathBuf>,
    /// After this long the run is stopped (SIGTERM, then SIGKILL 10 s later).
    pub timeout: Option<Duration>,
    pub overlap: Overlap,
    /// A tick this recent is still raced for by a worker that comes up (or resumes) late.
    pub misfire_grace: Duration,
    pub enabled: bool,
}

/// How a job's command is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `command: [prog, arg, ...]`: executed directly, no shell.
    Argv(Vec<String>),
    /// `command: "string"`: run as `/bin/sh -c <string>`.
    Shell(String),
}
