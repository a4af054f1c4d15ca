//! The command line: `run`, `check` and `next`, the log options, and the exit codes; the commands that read
//! the store — `status`, `history`, `explain`, which print the [`crate::inspect`] model's views — and those
//! that act through it — `pause`, `resume`, `trigger` — each in a module of its own under `cli/`.
//!
//! Kept out of `main.rs` so that the binary stays a few lines and the flags live next to what they do.
//! Everything the operator needs is here: `--help` documents each flag and the exit codes, `check`
//! reports every problem of a config file at once, and `next` shows exactly which instants a job fires
//! at (in its own time zone) — the quickest way to see the DST rule at work.

mod exit;
mod explain;
pub(crate) mod history;
mod honoured;
pub(crate) mod pause;
mod read;
mod render;
mod status;
mod trigger;

pub use self::exit::Exit;
pub use self::explain::ExplainArgs;
pub use self::history::HistoryArgs;
pub use self::pause::{JobsArg, PauseArgs, ResumeArgs};
pub use self::status::StatusArgs;
pub use self::trigger::TriggerArgs;

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};

use crate::config::{self, Config};
use crate::control::{self, Control};
use crate::logging::{self, events, LogFormat, LogOptions};
use crate::shutdown::Shutdown;

/// What `--help` says after the options: the exit codes, and how the config file is read.
fn after_help() -> String {
    format!(
        "{}\nIn the config file, ${{VAR}} is replaced from the environment and $$ is a literal $.",
        Exit::help()
    )
}

/// A cluster cron: identical workers read one jobs.yaml, race for a lease per (job, tick), and the
/// winner runs the job.
#[derive(Debug, clap::Parser)]
#[command(name = "redcron", version, after_help = after_help())]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
    /// Log format: `json` (one object per line) or `text`. Default: json when stdout is not a
    /// terminal, text when it is.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Log level or filter, RUST_LOG syntax: `debug`, or `info,redcron::lock=debug`. Default: the
    /// RUST_LOG environment variable if set, else `info`.
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
}

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Run the worker: race for every tick of every enabled job and run the ticks won, until
    /// SIGINT/SIGTERM (a second signal stops running jobs at once). SIGHUP, or a change of the config
    /// file, reloads the jobs (a file with problems is logged and not applied).
    Run(ConfigArg),
    /// Check the config file: print every problem, or each job with its next 3 fire times.
    Check(CheckArgs),
    /// Print the next fire times of one job, one RFC 3339 timestamp per line in the job's time zone.
    Next(NextArgs),
    /// Show the workers (alive, config, runs under way) and each job's next tick, last run, failures
    /// in a row, last success, and whether it is overdue.
    Status(StatusArgs),
    /// List the run history, newest first: runs, and ticks skipped, lost or missed, with why.
    History(HistoryArgs),
    /// Tell one tick's story: who raced, who won with which token, how it ended, or why nobody ran it.
    Explain(ExplainArgs),
    /// Pause jobs through the lock (one, several, or --all): no claim of them is granted anywhere until
    /// `resume` (or until --for ends); their ticks are recorded as skipped (paused). Runs under way go on.
    Pause(PauseArgs),
    /// Resume paused jobs (one, several, or --all): their next ticks run.
    Resume(ResumeArgs),
    /// Run a job once now, on whichever live worker claims it through the lock (exactly one), obeying
    /// its overlap rule; prints the run's id, or with --wait its outcome.
    Trigger(TriggerArgs),
}

/// Which config file to read.
#[derive(Debug, clap::Args)]
pub struct ConfigArg {
    /// The jobs file.
    #[arg(
        short = 'c',
        long = "config",
        value_name = "FILE",
        env = "REDCRON_CONFIG",
        default_value = "jobs.yaml"
    )]
    pub config: PathBuf,
}

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Show fire times after this instant (RFC 3339, e.g. 2026-10-25T00:00:00Z) instead of now.
    #[arg(long, value_name = "RFC3339", value_parser = parse_instant)]
    pub after: Option<DateTime<Utc>>,
    /// With a `postgres:` or `mysql:` store: print the SQL that creates the store's tables (what the
    /// first worker runs on a new database), for an administrator to run when redcron's user may not
    /// create tables, and nothing else.
    #[arg(long)]
    pub sql: bool,
}

/// Arguments of `next`.
#[derive(Debug, clap::Args)]
pub struct NextArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The job's name.
    #[arg(long, value_name = "NAME")]
    pub job: String,
    /// How many fire times to print.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub count: u32,
    /// Print fire times strictly after this instant (RFC 3339, e.g. 2026-10-25T00:00:00+02:00)
    /// instead of now.
    #[arg(long, value_name = "RFC3339", value_parser = parse_instant)]
    pub after: Option<DateTime<Utc>>,
    /// With a `postgres:` or `mysql:` store: print the SQL that creates the store's tables (what the
    /// first worker runs on a new database), for an administrator to run when redcron's user may not
    /// create tables, and nothing else.
    #[arg(long)]
    pub sql: bool,
}

/// Carries out `args`. Problems the user must fix (config, usage) are printed to stderr and give
/// [`Exit::Usage`]; an `Err` is a runtime failure, for the caller to print and exit with [`Exit::Failure`].
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.action {
        Action::Run(config) => run_worker(&args, &config.config),
        Action::Check(check_args) => check(check_args),
        Action::Next(next_args) => next(next_args),
        Action::Status(status_args) => status::run(status_args),
        Action::History(history_args) => history::run(history_args),
        Action::Explain(explain_args) => explain::run(explain_args),
        Action::Pause(pause_args) => pause::pause(pause_args),
        Action::Resume(resume_args) => pause::resume(resume_args),
        Action::Trigger(trigger_args) => trigger::run(trigger_args),
    }
}

fn run_worker(args: &Args, path: &Path) -> anyhow::Result<ExitCode> {
    // Before the load: a change made while the worker starts is then a change to reload.
    let watch = control::ConfigWatch::look(path.to_path_buf());
    let config = match load(path) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    // Before any thread of the worker starts: malloc's arenas are made per thread.
    crate::worker::memory::tune();
    let options = LogOptions {
        format: args.log_format.unwrap_or_else(default_log_format),
        filter: log_filter(args.log_level.as_deref()),
        worker_id: config.worker.id.clone(),
    };
    // Dropped when this returns: the log's last lines are written out before the process exits.
    let _flush = match logging::init(&options) {
        Ok(flush) => flush,
        Err(e) => {
            say_error(&e.to_string());
            return Ok(ExitCode::from(Exit::Usage));
        }
    };
    for warning in &config.warnings {
        tracing::warn!(event = events::config::WARNING, "{warning}");
    }
    let shutdown = Shutdown::new();
    let control = Control::new(shutdown.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(async {
        control::install_signals(control.handle())
            .context("cannot install the SIGINT/SIGTERM/SIGHUP handlers")?;
        watch.start(control.handle());
        anyhow::Ok(crate::worker::run(config, control).await)
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    if shutdown.is_immediate() {
        return Ok(ExitCode::from(Exit::Stopped));
    }
    match result {
        Ok(()) => Ok(ExitCode::from(Exit::Ok)),
        Err(e) => {
            tracing::error!(event = events::worker::FAILED, error = %e, "Worker failed");
            say_error(&e.to_string());
            Ok(ExitCode::from(Exit::Failure))
        }
    }
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let config = match load(&args.config.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    let after = args.after.unwrap_or_else(Utc::now);
    let schema = match &config.store {
        crate::config::StoreConfig::Sql(sql) => Some(crate::store::sql::Schema::new(
            sql.dialect,
            &config.lock.key_prefix,
        )),
        _ => None,
    };
    if args.sql {
        let Some(schema) = schema else {
            say_error("--sql: the config names no SQL store (`postgres:` or `mysql:`)");
            return Ok(ExitCode::from(Exit::Usage));
        };
        emit(&schema.script())?;
        return Ok(ExitCode::from(Exit::Ok));
    }
    let mut out = String::new();
    out.push_str(&format!("store: {}\n", config.store.summary()));
    for line in config.store.topology() {
        out.push_str(&line);
        out.push('\n');
    }
    if let Some(schema) = &schema {
        out.push_str(&format!(
            "tables: {} (schema {}), created by the first worker if missing; `redcron check --sql` prints their SQL\n",
            schema.tables().join(", "),
            crate::store::sql::SCHEMA_VERSION
        ));
    }
    let lock = &config.lock;
    out.push_str(&format!(
        "lock: ttl {}, renew every {}, node timeout {}, drift factor {}, {} retries after {}, key prefix {}\n",
        crate::config::show_duration(lock.ttl),
        crate::config::show_duration(lock.renew_every),
        crate::config::show_duration(lock.node_timeout),
        lock.drift_factor,
        lock.retries,
        crate::config::show_duration(lock.retry_delay),
        lock.key_prefix
    ));
    for job in &config.jobs {
        let disabled = if job.enabled { "" } else { " (disabled)" };
        out.push_str(&format!("job {}: {}{disabled}\n", job.name, job.schedule));
        let ticks: Vec<String> = job
            .schedule
            .ticks_after(after)
            .take(3)
            .map(|t| job.schedule.format_tick(t))
            .collect();
        for tick in ticks {
            out.push_str(&format!("  next: {tick}\n"));
        }
        // What `job.config_differs` compares between workers: equal on every host once a rollout is done.
        out.push_str(&format!("  fingerprint: {}\n", job.fingerprint()));
    }
    // What each worker announces as its `config_fingerprint`, and `status` compares.
    out.push_str(&format!("config fingerprint: {}\n", config.fingerprint()));
    for warning in &config.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    // Two names of one server would vote twice; a worker refuses the second (by `run_id`), and this
    // catches what resolves to one address before any worker starts.
    if let crate::config::StoreConfig::Redis(redis) = &config.store {
        let shared = crate::store::redis::node::shared_addresses(&redis.server_urls());
        if !shared.is_empty() {
            for (first, second, address) in shared {
                say_error(&format!(
                    "{}: redis nodes {first} and {second} are one server ({address}): it would vote \
                     once, not twice, and the majority would be out of reach sooner; list each server \
                     once in redis.nodes",
                    config.path.display()
                ));
            }
            return Ok(ExitCode::from(Exit::Usage));
        }
    }
    let (jobs, warnings) = (config.jobs.len(), config.warnings.len());
    out.push_str(&format!(
        "{}: OK, {jobs} job{}, {warnings} warning{}\n",
        config.path.display(),
        plural(jobs),
        plural(warnings)
    ));
    emit(&out)?;
    Ok(ExitCode::from(Exit::Ok))
}

fn next(args: &NextArgs) -> anyhow::Result<ExitCode> {
    let (_, job) = match load_job(&args.config, &args.job) {
        Ok(found) => found,
        Err(code) => return Ok(code),
    };
    let after = args.after.unwrap_or_else(Utc::now);
    let mut out = String::new();
    for tick in job.schedule.ticks_after(after).take(args.count as usize) {
        out.push_str(&job.schedule.format_tick(tick));
        out.push('\n');
    }
    emit(&out)?;
    Ok(ExitCode::from(Exit::Ok))
}

/// The config of `arg` and its job named `name`; or, printed, every problem of the file or an error naming
/// the jobs that exist, and the exit code for it.
fn load_job(arg: &ConfigArg, name: &str) -> Result<(Config, config::JobConfig), ExitCode> {
    let config = load(&arg.config)?;
    let job = find_job(&config, name)?.clone();
    Ok((config, job))
}

/// The job named `name`, or an error naming the jobs that exist, and the exit code for it.
fn find_job<'a>(config: &'a Config, name: &str) -> Result<&'a config::JobConfig, ExitCode> {
    if let Some(job) = config.jobs.iter().find(|job| job.name == name) {
        return Ok(job);
    }
    let known: Vec<&str> = config.jobs.iter().map(|job| job.name.as_str()).collect();
    let known = if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    };
    say_error(&format!(
        "no job named {name:?} in {}; known jobs: {known}",
        config.path.display()
    ));
    Err(ExitCode::from(Exit::Usage))
}

/// Who runs this command, for the pauses and trigger requests it writes: `$USER@host` — or, where
/// neither `USER` nor `LOGNAME` is set (a container, cron, `env -i`), the process's user from the
/// password database, or `uid-N` if it has none: never a bare `unknown`.
fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|user| !user.is_empty())
        .unwrap_or_else(os_user);
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{user}@{host}")
}

/// This process's user name from the password database, or `uid-N`.
fn os_user() -> String {
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buffer = vec![0 as libc::c_char; 4096];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to memory owned here and alive for the call; `buffer.len()` is its size.
    let code = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if code == 0 && !found.is_null() && !entry.pw_name.is_null() {
        // SAFETY: getpwuid_r succeeded, so pw_name points to a NUL-terminated string in `buffer`.
        let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
        if let Ok(name) = name.to_str() {
            if !name.is_empty() {
                return name.to_owned();
            }
        }
    }
    format!("uid-{uid}")
}

/// Prints why the store could not be read, and gives the documented exit code for it.
fn read_failed(error: &read::ReadError) -> ExitCode {
    say_error(&error.to_string());
    ExitCode::from(error.exit_code())
}

/// Loads the config, or prints every problem and gives the exit code for it.
fn load(path: &Path) -> Result<Config, ExitCode> {
    config::load(path).map_err(|e| {
        let count = e.problems().len();
        say(&e.to_string());
        if count > 0 {
            say_error(&format!(
                "{} has {count} problem{}; nothing was run",
                path.display(),
                plural(count)
            ));
        }
        ExitCode::from(Exit::Usage)
    })
}

/// json for machines (stdout is a pipe or file), text for a person at a terminal.
fn default_log_format() -> LogFormat {
    if std::io::stdout().is_terminal() {
        LogFormat::Text
    } else {
        LogFormat::Json
    }
}

/// `--log-level` if given, else RUST_LOG if set, else `info`.
fn log_filter(flag: Option<&str>) -> String {
    match flag {
        Some(filter) => filter.to_string(),
        None => std::env::var("RUST_LOG")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "info".to_string()),
    }
}

fn parse_instant(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("{e}; expected an RFC 3339 timestamp such as 2026-10-25T00:30:00+02:00")
        })
}

/// Writes `text` to stdout; a reader that went away (`| head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("cannot write to stdout"),
    }
}

/// A line to stderr; nothing sensible is left to do if stderr itself is gone.
fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn say_error(text: &str) {
    say(&format!("error: {text}"));
}

fn plural(count: usize) -> &'static str {
    if count == 1 {
        ""
    } else {
        "s"
    }
}
