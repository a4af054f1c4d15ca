//! `jobs.yaml`: the schedule and settings every worker reads.
//!
//! Parsed in two stages, as ripgrep does with its flags: `raw` reads the file's shape close to the
//! text (unknown fields rejected, every leaf kept with its line and column), then `validate` (and
//! `jobs` for the `jobs:` list) gives the values their meaning and makes the cross-field checks,
//! producing a [`Config`]. Both stages go on after a problem, so one run reports every problem in the
//! file, each with file, line, column and field.
//! `${VAR}` is replaced from the environment first (see `yaml`); the variables used by the store's
//! section and the dashboard's are remembered ([`Config::secret_env_vars`]), so that jobs do not inherit them.
//!
//! Defaults: `lock.ttl` 30s, `lock.renew_every` ttl/3, `lock.node_timeout` 50ms, `lock.drift_factor`
//! 0.01, `lock.retries` 3, `lock.retry_delay` 200ms, `redis.key_prefix` `redcron`, `worker.id`
//! `<hostname>-<pid>-<6 hex>`, `worker.shutdown_grace` 30s, `worker.max_clock_offset` 500ms,
//! `worker.clock_check_every` 60s, `worker.heartbeat_every` 5s, `worker.listen` none, `history.keep_ticks` 200, `history.missed_lookback` 1h, `dashboard.enabled` true (read-only and loopback-only without
//! a token), `dashboard.controls` false, `dashboard.public` false, `embedded.path`
//! `<key_prefix>.db` in `$STATE_DIRECTORY` or else beside the config file, and per job `timezone` UTC, `overlap` skip, `misfire_grace` 30s,
//! `enabled` true, no timeout, `retries` 0 (`retry_backoff` 10s, `retry_backoff_max` 10m), `output_tail` 2048, `inherit_env` all, `stop_grace` half of the lease's slack (at most 10 s;
//! see [`crate::lock::renewal_slack`]).

mod dashboard;
mod etcd;
mod jobs;
mod raw;
mod redis;
mod retry;
mod sql;
mod store;
mod validate;
mod worker_id;
mod zookeeper;

pub use dashboard::{DashboardConfig, DashboardToken, Serving, DEFAULT_TOKEN_NAME, MIN_TOKEN_LEN};
pub use store::{
    ClusterSeeds, EmbeddedConfig, EtcdConfig, RedisConfig, RedisNode, RedisTls, ReplicaAcks,
    SentinelGroup, SqlConfig, SqlDialect, SqlTls, StoreConfig, ZookeeperConfig, ZookeeperTls,
};

pub(crate) use crate::clock::show_duration;
pub(crate) use store::redact;
pub(crate) use worker_id::{claimant_here, ClaimantHere};
mod yaml;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::history::HistorySettings;
use crate::lock::{LockSettings, Overlap};
use crate::schedule::Schedule;

use yaml::Mark;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    /// The one store the workers race in: the store section given (`redis:`, `etcd:`), or else the
    /// embedded store.
    pub store: StoreConfig,
    /// Lease parameters (`lock:` plus the store's `key_prefix`), checked against each other: `renew_every <
    /// ttl − drift − node_timeout`, `node_timeout <= ttl / 10`, `0 <= drift_factor < 0.5`,
    /// `retries <= 100`.
    pub lock: LockSettings,
    /// This worker process's own settings.
    pub worker: WorkerConfig,
    /// How much run history the store keeps, and how far back missed ticks are looked for.
    pub history: HistorySettings,
    /// The alert hooks of jobs that name none of their own (`alerts:`).
    pub alerts: Alerts,
    /// Who may see the web dashboard and use its controls (`dashboard:`).
    pub dashboard: DashboardConfig,
    /// The jobs, in file order; names are unique.
    pub jobs: Vec<JobConfig>,
    /// The environment variables that the store's section (`StoreConfig::env_vars`, such as a password)
    /// and the dashboard's (its tokens) take through `${VAR}`: never passed to a job unless the job's `env` names them.
    pub secret_env_vars: BTreeSet<String>,
    /// Problems that do not stop the worker but that an operator should see (e.g. an even node count),
    /// each formatted like a [`Problem`]: `file:line:column: field: message`.
    pub warnings: Vec<String>,
}

/// Settings of this worker process.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// This worker's id in logs and lease values (default `<hostname>-<pid>-<short random>`); letters,
    /// digits and `_ . - : @` only, so it never contains the `/` that separates it from a lease's uuid.
    pub id: String,
    /// Whether `id` was made up because the file names none: a reload then keeps the running worker's
    /// id rather than comparing two made-up ones (which always differ) and asking for a restart.
    pub id_is_default: bool,
    /// How long running jobs may go on after a graceful shutdown was requested.
    pub shutdown_grace: Duration,
    /// Above this offset to the Redis nodes' clocks the worker warns (`clock.offset_high`). Not zero.
    pub max_clock_offset: Duration,
    /// How often the worker measures its offset to the Redis nodes' clocks. Not zero.
    pub clock_check_every: Duration,
    /// How often the worker announces itself to the store (`worker.heartbeat_every`); it counts as dead
    /// after [`crate::membership::HEARTBEATS_MISSED`] missed announcements.
    pub heartbeat_every: Duration,
    /// Where the worker serves `/metrics`, `/healthz` and `/readyz` (`worker.listen`); `None` (the
    /// default): no listener. Never port 0.
    pub listen: Option<SocketAddr>,
}

/// One job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Unique among the jobs, `[A-Za-z0-9_.-]+`.
    pub name: String,
    /// When it fires, in its time zone.
    pub schedule: Schedule,
    /// What it runs.
    pub command: Command,
    /// The command as the file writes it, when a `${VAR}` was replaced in it (the arguments of a list
    /// joined by spaces): what is shown of it (the dashboard), so that no variable's value is.
    pub command_as_written: Option<String>,
    /// Environment variables set for the child process, over what it inherits.
    pub env: BTreeMap<String, String>,
    /// What of the worker's environment the child inherits (never the store's variables).
    pub inherit_env: InheritEnv,
    /// The child's working directory (default: the worker's).
    pub workdir: Option<PathBuf>,
    /// After this long the run is stopped (SIGTERM, then SIGKILL `stop_grace` later). Never zero.
    pub timeout: Option<Duration>,
    /// How long a child that is being stopped gets between SIGTERM and SIGKILL. A run whose lease was
    /// not renewed by `stop_grace` before its deadline is stopped then, so the child is gone by the
    /// deadline. Above zero and below the lease's slack (`ttl − drift − renew_every − node_timeout`).
    pub stop_grace: Duration,
    /// Whether a tick may start while an earlier run of this job still holds it.
    pub overlap: Overlap,
    /// A tick this recent is still raced for by a worker that comes up (or resumes) late.
    pub misfire_grace: Duration,
    /// A delay before each tick is raced, the same on every worker: a fraction of `jitter` drawn from a
    /// hash of (job, tick) ([`JobConfig::jitter_for`]). Spreads a herd of jobs due at one instant.
    pub jitter: Duration,
    /// A disabled job is checked and listed but never raced for.
    pub enabled: bool,
    /// The commands run when the job starts failing and when it recovers (its own, or `alerts:`'s).
    pub alerts: Alerts,
    /// How a failed run is tried again (`retries`, `retry_backoff`, `retry_backoff_max`).
    pub retry: RetryPolicy,
    /// How many of the last bytes of its stdout and of its stderr a run that does not succeed keeps in
    /// its history entry (`tail_out`, `tail_err`); 0: none. At most 64 KiB, default 2048.
    pub output_tail: usize,
}

/// How a job's failed run is tried again: up to `retries` more attempts, attempt `k` waiting
/// [`RetryPolicy::delay`] after the one before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How many more attempts after a run that failed (`failure`, `timeout`); 0 to 100, default 0.
    pub retries: u32,
    /// The wait before the first retry; it doubles for each later one. Above zero, default 10 s.
    pub backoff: Duration,
    /// The longest wait before a retry. At least `backoff`, default 10 min.
    pub backoff_max: Duration,
}

impl JobConfig {
    /// A short hash (16 hex digits) of what this job *is*: its schedule and time zone, command,
    /// environment and what it inherits, working directory, timeout, stop grace, overlap rule, misfire
    /// grace and whether it is enabled.
    ///
    /// It travels in every lease value, so that workers running different versions of `jobs.yaml` during
    /// a rollout can tell, and say so (`job.config_differs`). Built from an explicit text of the fields
    /// (not `Debug`), so that workers built by different compilers agree on it.
    pub fn fingerprint(&self) -> String {
        let mut text = String::new();
        let mut field = |name: &str, value: &str| {
            text.push_str(name);
            text.push('=');
            text.push_str(&value.len().to_string());
            text.push(':');
            text.push_str(value);
            text.push(';');
        };
        field("schedule", self.schedule.expression());
        field("timezone", self.schedule.timezone().name());
        match &self.command {
            Command::Shell(script) => field("shell", script),
            Command::Argv(argv) => argv.iter().for_each(|arg| field("arg", arg)),
        }
        for (key, value) in &self.env {
            field("env", key);
            field("value", value);
        }
        match &self.inherit_env {
            InheritEnv::All => field("inherit_env", "all"),
            InheritEnv::Nothing => field("inherit_env", "none"),
            InheritEnv::Only(names) => names.iter().for_each(|name| field("inherit", name)),
        }
        let workdir = self.workdir.as_ref().map(|dir| dir.display().to_string());
        field("workdir", workdir.as_deref().unwrap_or(""));
        let millis = |d: Option<Duration>| d.map_or(String::new(), |d| d.as_millis().to_string());
        field("timeout", &millis(self.timeout));
        field("stop_grace", &millis(Some(self.stop_grace)));
        field("overlap", &format!("{:?}", self.overlap));
        field("misfire_grace", &millis(Some(self.misfire_grace)));
        for (name, hook) in [
            ("on_failure", &self.alerts.on_failure),
            ("on_recovery", &self.alerts.on_recovery),
        ] {
            // Only when set, so that fingerprints of jobs without hooks stay what they were.
            match hook {
                Some(Command::Shell(script)) => field(name, script),
                Some(Command::Argv(argv)) => argv.iter().for_each(|arg| field(name, arg)),
                None => {}
            }
        }
        if !self.jitter.is_zero() {
            // Only when set, so that fingerprints of jobs without jitter stay what they were.
            field("jitter", &millis(Some(self.jitter)));
        }
        if self.retry.retries > 0 {
            // Only when set, so that fingerprints of jobs without retries stay what they were.
            field("retries", &self.retry.retries.to_string());
            field("retry_backoff", &millis(Some(self.retry.backoff)));
            field("retry_backoff_max", &millis(Some(self.retry.backoff_max)));
        }
        field("enabled", if self.enabled { "yes" } else { "no" });
        format!("{:016x}", crate::lock::order::fnv1a(text.as_bytes()))
    }
}

impl JobConfig {
    /// How long after `tick` the tick is raced: a fraction of `jitter` drawn from FNV-1a of (job, tick),
    /// so that every worker computes the same delay without talking, and different ticks and jobs spread
    /// over the whole `jitter`.
    pub fn jitter_for(&self, tick: crate::schedule::Tick) -> Duration {
        if self.jitter.is_zero() {
            return Duration::ZERO;
        }
        let key = format!("{}\n{}", self.name, tick.as_millis());
        let fraction = (crate::lock::order::fnv1a(key.as_bytes()) % 1_000_000) as f64 / 1_000_000.0;
        self.jitter.mul_f64(fraction)
    }

    /// When `tick`'s window ends — the job's next tick or the end of its misfire grace, whichever comes
    /// first: workers race the tick no longer, a miss is looked for after it, and `redcron status` counts
    /// a tick with no entry by then as overdue.
    ///
    /// Never panics: a tick may come from the store (a history entry), and a grace past the last instant
    /// there is ends there.
    pub fn window_end(&self, tick: crate::schedule::Tick) -> chrono::DateTime<chrono::Utc> {
        let grace = chrono::Duration::from_std(self.misfire_grace).unwrap_or_default();
        let graced = tick
            .to_utc()
            .checked_add_signed(grace)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        match self.schedule.next_after(tick.to_utc()) {
            Some(next) => next.to_utc().min(graced),
            None => graced,
        }
    }
}

impl Config {
    /// The fingerprint of the whole schedule: FNV-1a over every job's name and
    /// [`JobConfig::fingerprint`], in name order. Equal on workers that run the same jobs, whatever the
    /// order of the file or its other sections; `redcron status` marks workers whose fingerprint differs.
    pub fn fingerprint(&self) -> String {
        let mut jobs: Vec<(&str, String)> = self
            .jobs
            .iter()
            .map(|job| (job.name.as_str(), job.fingerprint()))
            .collect();
        jobs.sort();
        let text: String = jobs
            .iter()
            .map(|(name, fingerprint)| format!("{name}={fingerprint};"))
            .collect();
        format!("{:016x}", crate::lock::order::fnv1a(text.as_bytes()))
    }
}

/// Alert hooks: commands run, with the run's fields in their environment, when a job's runs start failing
/// (the first final failure after a success) and when they recover (the first success after a final
/// failure) — once per change, not once per failing run or attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alerts {
    pub on_failure: Option<Command>,
    pub on_recovery: Option<Command>,
}

impl Alerts {
    /// Whether any hook is set.
    pub fn any(&self) -> bool {
        self.on_failure.is_some() || self.on_recovery.is_some()
    }
}

/// How a job's command is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `command: [prog, arg, ...]`: executed directly, no shell. Never empty; `prog` is not empty.
    Argv(Vec<String>),
    /// `command: "string"`: run as `/bin/sh -c <string>`. Not blank.
    Shell(String),
}

/// What of the worker's environment a job's child process inherits (`inherit_env`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum InheritEnv {
    /// `all` (the default): every variable.
    #[default]
    All,
    /// `none`: nothing; the child sees only the job's `env` and the `REDCRON_*` variables.
    Nothing,
    /// A list of names: these variables, where the worker has them. Each is a valid variable name.
    Only(BTreeSet<String>),
}

/// One thing wrong with the file, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, as given on the command line.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The field path, e.g. `jobs[1].schedule` (jobs counted from 0); empty for the file as a whole.
    pub field: String,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl fmt::Display for Problem {
    /// `jobs.yaml:14:15: jobs[1].schedule: invalid cron expression ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file.display(), self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("{}: cannot read the configuration file: {source}{}", path.display(), read_hint(source))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read and is wrong; every problem found, in file order, one per line in `Display`.
    #[error("{}", display_lines(problems))]
    Invalid { problems: Vec<Problem> },
}

impl ConfigError {
    /// The problems found (empty for [`ConfigError::Read`]).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Read { .. } => &[],
            ConfigError::Invalid { problems } => problems,
        }
    }
}

/// What to do about a file that could not be read: a missing one is most often the default
/// `jobs.yaml` looked for in the wrong directory, so say how to name another.
fn read_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::NotFound => {
            "; name the jobs file with -c FILE (or REDCRON_CONFIG=FILE); without either it is jobs.yaml in the current directory"
        }
        _ => "",
    }
}

fn display_lines(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads and validates the configuration file at `path`, taking `${VAR}` from the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// Validates `text` as if read from `path` (used in messages), taking `${VAR}` from the process
/// environment.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    parse_with_env(text, path, &|name| std::env::var(name).ok())
}

/// Like [`parse`], with `${VAR}` looked up through `env` instead of the process environment.
pub fn parse_with_env(
    text: &str,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let mut report = Report {
        file: path.to_path_buf(),
        problems: Vec::new(),
        warnings: Vec::new(),
        tainted: Vec::new(),
    };
    let document = match yaml::parse(text, env) {
        Ok(document) => document,
        Err(syntax) => {
            report.error(syntax.mark, &syntax.field, syntax.message);
            return Err(report.into_error());
        }
    };
    for problem in &document.problems {
        report.error(problem.mark, "", problem.message.clone());
    }
    report.tainted = document.tainted.clone();
    let raw = raw::read(document.root.as_ref(), &mut report);
    let mut config = validate::config(
        raw,
        path,
        &mut report,
        chrono::Utc::now(),
        &|section: &str| document.variables_under(section),
        &|mark: yaml::Mark| document.written(mark).map(str::to_string),
        env,
    );
    if !report.problems.is_empty() {
        return Err(report.into_error());
    }
    report.warnings.sort_by_key(|w| (w.line, w.column));
    config.warnings = report.warnings.iter().map(Problem::to_string).collect();
    Ok(config)
}

/// Problems and warnings as they are found.
pub(crate) struct Report {
    file: PathBuf,
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
    /// Scalars whose `${...}` failed: problems reported at them would only repeat that failure.
    tainted: Vec<Mark>,
}

impl Report {
    fn problem(&self, mark: Mark, field: &str, message: String) -> Problem {
        Problem {
            file: self.file.clone(),
            line: mark.line,
            column: mark.column,
            field: field.to_string(),
            message,
        }
    }

    /// Records an error at `mark` in `field`.
    pub(crate) fn error(&mut self, mark: Mark, field: &str, message: impl Into<String>) {
        if !self.tainted.contains(&mark) {
            let problem = self.problem(mark, field, message.into());
            self.problems.push(problem);
        }
    }

    /// Records a warning at `mark` in `field`.
    pub(crate) fn warn(&mut self, mark: Mark, field: &str, message: impl Into<String>) {
        if !self.tainted.contains(&mark) {
            let warning = self.problem(mark, field, message.into());
            self.warnings.push(warning);
        }
    }

    fn into_error(mut self) -> ConfigError {
        self.problems.sort_by_key(|p| (p.line, p.column));
        ConfigError::Invalid {
            problems: self.problems,
        }
    }
}
