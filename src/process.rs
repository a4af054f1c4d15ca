//! The job's child process: spawn it, stream its output into the log, and end it.
//!
//! A job may be a shell pipeline whose real work happens in grandchildren, so each child leads a process
//! group of its own and every signal goes to the whole group: stopping a run must not leave a `sleep` or a
//! backup tool behind. Nor may a run that ends by itself: when the child (the group's leader) exits, what
//! is left of its tree is ended too — SIGTERM to its group and to the descendants that left the group
//! (`setsid`; found as the worker's orphans, see [`reaper`]), SIGKILL [`ChildSpec::stop_grace`] later —
//! and the run is over only once none of them lives. A run that left a process behind would still hold
//! nothing (its lease released, `overlap: skip` letting the next tick start) while that process works on:
//! two "runs" at once. Ending them, rather than waiting for them, keeps a run's length the leader's: a
//! daemon started by a job does not hold the job for ever. Output is logged line by line as it arrives (`run.output`, inside the caller's
//! span, so each line carries the run's `job`, `tick`, `run_id` and `token`), and [`RunningChild::wait`]
//! returns only once the child has exited and its output has been fully logged, so the exit event is
//! always the run's last line. The child inherits no environment: it gets exactly [`ChildSpec::env`]
//! (the worker decides what that holds, see `worker::env`). The same readers keep the last bytes of each
//! stream when asked ([`RunningChild::spawn_keeping`], `tail`), for the history of a run that failed.

pub(crate) mod reaper;
mod tail;

use std::collections::HashSet;
use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;
use tracing::{info, warn, Instrument, Span};

use crate::config::Command;
use crate::logging::events;

/// Output lines longer than this are cut (and logged with `truncated = true`), so a job printing a
/// binary blob cannot make the worker buffer it whole.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// After SIGKILL the group is dead, but an escaped descendant may still hold the pipes: stop reading then.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// While the rest of a tree is being ended, how often it is looked at again when no SIGCHLD came (a
/// member whose parent is another member dies without one).
const REST_POLL: Duration = Duration::from_millis(100);

/// What to run, as configured for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    pub command: Command,
    /// The child's whole environment: nothing of the worker's is inherited beyond it.
    pub env: Vec<(OsString, OsString)>,
    /// The child's working directory; the worker's when `None`.
    pub workdir: Option<PathBuf>,
    /// Once the child has exited, how long what it left running has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// It exited with this status code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

impl ExitKind {
    /// Whether the job succeeded (exit code 0).
    pub fn success(self) -> bool {
        self == ExitKind::Code(0)
    }

    fn from_status(status: ExitStatus) -> ExitKind {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitKind::Code(code),
            (None, Some(signal)) => ExitKind::Signal(signal),
            // `wait` reports only terminated children, which have one or the other.
            (None, None) => ExitKind::Code(-1),
        }
    }
}

impl std::fmt::Display for ExitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ExitKind::Code(code) => write!(f, "exit code {code}"),
            ExitKind::Signal(signal) => {
                let name = match signal {
                    libc::SIGHUP => "SIGHUP",
                    libc::SIGINT => "SIGINT",
                    libc::SIGQUIT => "SIGQUIT",
                    libc::SIGABRT => "SIGABRT",
                    libc::SIGKILL => "SIGKILL",
                    libc::SIGSEGV => "SIGSEGV",
                    libc::SIGPIPE => "SIGPIPE",
                    libc::SIGTERM => "SIGTERM",
                    _ => return write!(f, "signal {signal}"),
                };
                write!(f, "signal {signal} ({name})")
            }
        }
    }
}

/// Why a child could not be run or waited for.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program, and the working directory when one was configured.
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the job: its command is empty")]
    EmptyCommand,
    #[error("cannot wait for child process {pid}: {source}")]
    Wait {
        pid: u32,
        #[source]
        source: io::Error,
    },
}

/// The last bytes a child printed on each stream (see [`RunningChild::tails`]); `None` for a stream that
/// printed nothing or whose tail was not kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputTails {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

/// The tails of stdout and stderr, shared by the output task and the child's owner, so that what was read
/// before the task was abandoned (see [`RunningChild::stop_when`]) is still there.
type SharedTails = Arc<Mutex<[tail::Tail; 2]>>;

/// A spawned child: its process group, its exit status once known, and the tasks logging its output.
#[derive(Debug)]
pub struct RunningChild {
    child: Child,
    pid: u32,
    status: Option<ExitKind>,
    /// Logs stdout and stderr; `None` once both reached end of file (or were abandoned).
    output: Option<JoinHandle<()>>,
    /// The last bytes of each stream, when kept.
    tails: Option<SharedTails>,
    /// The run this child is, as its environment's [`reaper::RUN_MARKER`] says; `None` when unmarked.
    run: Option<String>,
    stop_grace: Duration,
    /// What is left of the tree once the child has exited: `None` before, or once all of it is gone.
    rest: Option<Rest>,
    /// The child exited and nothing of its tree lives any more.
    rest_gone: bool,
    /// [`RunningChild::kill_now`] was called: what is left gets SIGKILL, not SIGTERM.
    killed: bool,
}

/// The processes a child left when it exited, being ended.
#[derive(Debug)]
struct Rest {
    /// SIGKILL from then on.
    kill_at: tokio::time::Instant,
    /// SIGKILL was sent (at `kill_at`, or by [`RunningChild::kill_now`]).
    killed: bool,
    /// The group was sent SIGTERM.
    group_signalled: bool,
    /// The orphans sent SIGTERM already.
    signalled: HashSet<u32>,
    /// The orphans of this run the last scan found.
    orphans: Vec<reaper::Orphan>,
}

impl RunningChild {
    /// Spawns the child in its own process group (so SIGTERM/SIGKILL reach its whole tree, e.g. the
    /// children of `/bin/sh -c`), stdin null, stdout/stderr piped, with exactly the spec's environment.
    ///
    /// Each output line is logged as `run.output` (`stream`, `line`) inside the caller's current span.
    /// Must be called within a tokio runtime. Dropping the value SIGKILLs the group if it may still run.
    pub fn spawn(spec: &ChildSpec) -> Result<RunningChild, ProcessError> {
        RunningChild::spawn_keeping(spec, 0)
    }

    /// As [`RunningChild::spawn`], and the same readers keep the last `tail` bytes of stdout and of stderr
    /// ([`RunningChild::tails`]); 0 keeps nothing. At most `tail` bytes per stream, allocated only once the
    /// stream prints.
    pub fn spawn_keeping(spec: &ChildSpec, tail: usize) -> Result<RunningChild, ProcessError> {
        let (program, args): (&str, &[String]) = match &spec.command {
            Command::Argv(argv) => match argv.split_first() {
                Some((program, args)) => (program, args),
                None => return Err(ProcessError::EmptyCommand),
            },
            Command::Shell(script) => ("/bin/sh", std::slice::from_ref(script)),
        };
        let mut command = tokio::process::Command::new(resolve(program, spec));
        if matches!(spec.command, Command::Shell(_)) {
            command.arg("-c");
        }
        command
            .args(args)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &spec.workdir {
            command.current_dir(dir);
        }
        let spawned = reaper::Own::spawn(|| {
            let spawned = command.spawn();
            let pid = spawned.as_ref().ok().and_then(Child::id);
            (spawned, pid)
        });
        let mut child = spawned.map_err(|source| ProcessError::Spawn {
            program: match &spec.workdir {
                Some(dir) => format!("{program} (in {})", dir.display()),
                None => program.to_owned(),
            },
            source,
        })?;
        // A freshly spawned child that has not been waited for always has an id.
        let pid = child.id().unwrap_or_default();
        // Both were set to `Stdio::piped()` above, so both are present.
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let span = Span::current();
        let tails = (tail > 0)
            .then(|| Arc::new(Mutex::new([tail::Tail::new(tail), tail::Tail::new(tail)])));
        let keep = |stream: usize| {
            let tails = tails.clone();
            move |chunk: &[u8]| {
                if let Some(tails) = &tails {
                    // A panic while holding the lock cannot leave a tail inconsistent: take it as it is.
                    let mut tails = tails
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    tails[stream].push(chunk);
                }
            }
        };
        let (keep_out, keep_err) = (keep(0), keep(1));
        let output = tokio::spawn(
            async move {
                tokio::join!(
                    log_lines(stdout, "stdout", keep_out),
                    log_lines(stderr, "stderr", keep_err)
                );
            }
            .instrument(span),
        );
        let run = spec
            .env
            .iter()
            .rev()
            .find(|(key, _)| key == reaper::RUN_MARKER);
        let run = run
            .map(|(_, value)| value.to_string_lossy().into_owned())
            .filter(|value| !value.is_empty());
        Ok(RunningChild {
            child,
            pid,
            status: None,
            output: Some(output),
            tails,
            run,
            stop_grace: spec.stop_grace,
            rest: None,
            rest_gone: false,
            killed: false,
        })
    }

    /// The last bytes of stdout and stderr read so far (all of them once [`RunningChild::wait`] returned),
    /// each cut on a UTF-8 boundary and lossy; empty when spawned without a tail.
    pub fn tails(&self) -> OutputTails {
        let Some(tails) = &self.tails else {
            return OutputTails::default();
        };
        let tails = tails
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        OutputTails {
            stdout: tails[0].text(),
            stderr: tails[1].text(),
        }
    }

    /// The process id of the child, which is also the id of its process group.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the child to exit, then for what it left running to be ended (see the module's doc),
    /// and for its output to be fully logged; returns how the child ended.
    ///
    /// Cancel-safe: it may sit in a `select!` and be called again; the exit status is kept once known, and
    /// the ending of the rest goes on where it was.
    pub async fn wait(&mut self) -> Result<ExitKind, ProcessError> {
        let status = self.wait_exit().await?;
        self.end_the_rest().await;
        if let Some(output) = &mut self.output {
            // Nothing of the tree lives any more; only a process that was handed the pipes by other means
            // can hold them now. The logging task does not panic; a cancelled one has nothing more to log.
            if tokio::time::timeout(DRAIN_AFTER_KILL, output)
                .await
                .is_err()
            {
                self.abandon_output();
            }
            self.output = None;
        }
        Ok(status)
    }

    /// Ends what the exited child left of its tree: its group, and the orphans of its run. SIGTERM at
    /// once, SIGKILL from `stop_grace` on (or at once after [`RunningChild::kill_now`]); returns when none
    /// of them lives.
    async fn end_the_rest(&mut self) {
        if self.rest_gone {
            return;
        }
        let scanner = reaper::Scanner::get();
        let mut sigchld = None;
        loop {
            let orphans = match scanner {
                Some(scanner) => {
                    let scan = scanner.after_now().await;
                    let run = self.run.as_deref().unwrap_or_default();
                    let mine = scan.orphans.iter().filter(|orphan| orphan.belongs_to(run));
                    mine.cloned().collect()
                }
                None => Vec::new(),
            };
            if !self.group_lives() && orphans.is_empty() {
                self.rest = None;
                self.rest_gone = true;
                return;
            }
            let now = tokio::time::Instant::now();
            let rest = self.rest.get_or_insert_with(|| {
                info!(
                    event = events::run::ENDING_REST,
                    pid = self.pid,
                    escaped = orphans.len() as u64,
                    kill_in_ms = self.stop_grace.as_millis() as u64,
                    "The job's process exited and left processes running: SIGTERM to them, SIGKILL after stop_grace"
                );
                Rest {
                    kill_at: now + self.stop_grace,
                    killed: self.killed,
                    group_signalled: false,
                    signalled: HashSet::new(),
                    orphans: Vec::new(),
                }
            });
            rest.orphans = orphans;
            let kill = rest.killed || now >= rest.kill_at;
            let kill_at = rest.kill_at;
            if kill {
                rest.killed = true;
                rest.orphans
                    .iter()
                    .for_each(|orphan| orphan.signal(libc::SIGKILL));
            } else {
                for orphan in &rest.orphans {
                    if rest.signalled.insert(orphan.pid) {
                        orphan.signal(libc::SIGTERM);
                    }
                }
            }
            let first = !std::mem::replace(&mut rest.group_signalled, true);
            if kill {
                self.signal_group(libc::SIGKILL);
            } else if first {
                self.signal_group(libc::SIGTERM);
            }
            if sigchld.is_none() {
                use tokio::signal::unix::{signal, SignalKind};
                sigchld = signal(SignalKind::child()).ok();
            }
            let child_died = async {
                match &mut sigchld {
                    Some(stream) => {
                        stream.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = child_died => {}
                () = tokio::time::sleep(REST_POLL) => {}
                () = tokio::time::sleep_until(kill_at), if !kill => {}
            }
        }
    }

    /// Whether a process of the child's group (other than its reaped leader) still lives.
    fn group_lives(&self) -> bool {
        let Ok(pgid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the group exists.
        pgid > 0 && unsafe { libc::killpg(pgid, 0) } == 0
    }

    fn abandon_output(&mut self) {
        warn!(
            event = events::run::OUTPUT_ABANDONED,
            pid = self.pid,
            "Output still open after the job's processes were ended; stopped reading it"
        );
        if let Some(output) = self.output.take() {
            output.abort();
        }
    }

    /// SIGTERM to the process group, then SIGKILL to the group after `grace` if the child has not exited
    /// and closed its output by then; returns how the child ended.
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitKind, ProcessError> {
        self.stop_when(tokio::time::sleep(grace)).await
    }

    /// SIGTERM to the process group now, then SIGKILL to the group as soon as `kill` completes if the
    /// child has not exited and closed its output by then; returns how the child ended.
    ///
    /// `kill` is any future — a deadline on whatever clock the caller keeps, an operator's second
    /// signal — so the caller decides when the child must be gone.
    pub async fn stop_when(
        &mut self,
        kill: impl Future<Output = ()>,
    ) -> Result<ExitKind, ProcessError> {
        if self.is_finished() {
            return self.wait().await;
        }
        self.signal_group(libc::SIGTERM);
        tokio::select! {
            result = self.wait() => return result,
            () = kill => {}
        }
        self.kill_now();
        let status = self.wait_exit().await?;
        if tokio::time::timeout(DRAIN_AFTER_KILL, self.wait())
            .await
            .is_err()
        {
            self.abandon_output();
        }
        Ok(status)
    }

    /// SIGKILL to the process group and to the orphans of the run found so far, unless the child has
    /// already finished; what is found later gets SIGKILL at once too.
    pub fn kill_now(&mut self) {
        if !self.is_finished() {
            self.killed = true;
            self.signal_group(libc::SIGKILL);
            if let Some(rest) = &mut self.rest {
                rest.killed = true;
                rest.orphans
                    .iter()
                    .for_each(|orphan| orphan.signal(libc::SIGKILL));
            }
        }
    }

    /// Waits for the child itself to exit, not for its output.
    async fn wait_exit(&mut self) -> Result<ExitKind, ProcessError> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self
            .child
            .wait()
            .await
            .map_err(|source| ProcessError::Wait {
                pid: self.pid,
                source,
            })?;
        reaper::Own::forget(self.pid);
        Ok(*self.status.insert(ExitKind::from_status(status)))
    }

    /// Exited, the rest of its tree ended and output fully read: nothing of it is left to signal.
    fn is_finished(&self) -> bool {
        self.status.is_some() && self.rest_gone && self.output.is_none()
    }

    /// Signals the group. The group id cannot name another group while the group exists (Linux keeps a
    /// pid's number while any process has it as its group), and this is called only until a check found
    /// the group empty: the number could be another group's only if it were freed and handed out again in
    /// between, which takes a whole turn of the pid numbers within one [`REST_POLL`].
    fn signal_group(&self, signal: i32) {
        let Ok(pgid) = libc::pid_t::try_from(self.pid) else {
            return;
        };
        if pgid > 0 {
            // SAFETY: killpg has no memory effects; ESRCH (group already gone) is expected and harmless.
            unsafe {
                libc::killpg(pgid, signal);
            }
        }
    }
}

impl Drop for RunningChild {
    /// Kills the whole group, not just the leader (which `kill_on_drop` alone would do).
    fn drop(&mut self) {
        self.kill_now();
        if let Some(output) = self.output.take() {
            output.abort();
        }
        if self.status.is_none() {
            // tokio reaps a dropped child; a scan that takes it for an orphan meanwhile only kills it again.
            reaper::Own::forget(self.pid);
        }
    }
}

/// The program to start: `program` as found on the child's `PATH` when it names no directory, so that
/// std starts the child with `posix_spawn` (a `vfork`) rather than `fork` + `execvp`. std forks whenever
/// the environment was cleared or sets `PATH` and the program has no `/`, to search the child's `PATH`
/// in the child; a fork copies the worker's page tables, which costs more the larger the worker is.
/// Searched as `execvp` would: the child's `PATH` (glibc's default `/bin:/usr/bin` without one), an empty
/// entry meaning the working directory, the first executable file. Not found: `program` unchanged, so
/// the spawn fails (or finds it) exactly as before.
fn resolve(program: &str, spec: &ChildSpec) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    if program.contains('/') || program.is_empty() {
        return PathBuf::from(program);
    }
    let path = spec.env.iter().rev().find(|(key, _)| key == "PATH");
    let path = path.map_or(OsString::from("/bin:/usr/bin"), |(_, value)| value.clone());
    let here = spec.workdir.clone().unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            here.join(dir).join(program)
        })
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from(program))
}

/// Logs each line of `stream` as `run.output`; lines over [`MAX_LINE_BYTES`] are cut. Every byte read is
/// also handed to `keep`, as it arrives.
async fn log_lines<R: AsyncRead + Unpin>(
    stream: Option<R>,
    name: &'static str,
    mut keep: impl FnMut(&[u8]),
) {
    let Some(stream) = stream else { return };
    // Small: a worker may have thousands of children running, most of which print little or nothing.
    let mut reader = BufReader::with_capacity(1024, stream);
    let mut line = Vec::new();
    let mut cut = false;
    loop {
        let chunk = match reader.fill_buf().await {
            Ok(chunk) => chunk,
            Err(error) => {
                warn!(event = events::run::OUTPUT_ERROR, stream = name, error = %error, "Cannot read the job's output");
                return;
            }
        };
        if chunk.is_empty() {
            if !line.is_empty() {
                emit(name, &line, cut);
            }
            return;
        }
        let (taken, at_end) = match chunk.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (chunk.len(), false),
        };
        keep(&chunk[..taken]);
        let room = MAX_LINE_BYTES.saturating_sub(line.len());
        let body = &chunk[..taken - usize::from(at_end)];
        cut |= body.len() > room;
        line.extend_from_slice(&body[..body.len().min(room)]);
        reader.consume(taken);
        if at_end {
            emit(name, &line, cut);
            line.clear();
            cut = false;
        }
    }
}

fn emit(stream: &'static str, line: &[u8], cut: bool) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    if cut {
        info!(event = events::run::OUTPUT, stream, line = %text, truncated = true, "Output line (cut at 64 KiB)");
    } else {
        info!(event = events::run::OUTPUT, stream, line = %text, "Output line");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::{layer, LogFormat};
    use serde_json::Value;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    use tracing::subscriber::DefaultGuard;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Collects the JSON log lines written on this thread (tokio tests run tasks on the test thread).
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Logs {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .expect("not poisoned")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Logs {
        type Writer = Logs;
        fn make_writer(&'w self) -> Logs {
            self.clone()
        }
    }

    impl Logs {
        fn capture() -> (Logs, DefaultGuard) {
            let logs = Logs::default();
            let subscriber =
                tracing_subscriber::registry().with(layer(LogFormat::Json, "w", logs.clone()));
            (logs, tracing::subscriber::set_default(subscriber))
        }

        /// The `run.output` events so far.
        fn output(&self) -> Vec<Value> {
            let bytes = self.0.lock().expect("not poisoned").clone();
            String::from_utf8_lossy(&bytes)
                .lines()
                .map(|line| serde_json::from_str::<Value>(line).expect("one JSON object per line"))
                .filter(|event| event["event"] == "run.output")
                .collect()
        }

        fn lines(&self, stream: &str) -> Vec<String> {
            let output = self.output();
            let lines = output.iter().filter(|e| e["stream"] == stream);
            lines
                .map(|e| e["line"].as_str().unwrap_or_default().to_owned())
                .collect()
        }

        /// Polls until `stream` has a first line (the tests print a pid first).
        async fn first_line(&self, stream: &str) -> String {
            for _ in 0..500 {
                if let Some(line) = self.lines(stream).into_iter().next() {
                    return line;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("no {stream} line within 5 s");
        }
    }

    /// A shell command with the test's own environment (its PATH finds `sleep`, `head`, `tr`).
    fn shell(script: &str) -> ChildSpec {
        ChildSpec {
            command: Command::Shell(script.to_owned()),
            env: std::env::vars_os().collect(),
            workdir: None,
            stop_grace: Duration::from_secs(1),
        }
    }

    async fn run(spec: &ChildSpec) -> ExitKind {
        let mut child = RunningChild::spawn(spec).expect("spawns");
        child.wait().await.expect("waits")
    }

    /// Whether `pid` is gone (or a zombie about to be reaped by init).
    fn is_dead(pid: i32) -> bool {
        // SAFETY: signal 0 only checks for existence.
        let exists = unsafe { libc::kill(pid, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                stat.rsplit(')')
                    .next()
                    .unwrap_or_default()
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false);
        !exists || zombie
    }

    async fn assert_dies(pid: i32) {
        for _ in 0..200 {
            if is_dead(pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("process {pid} still alive");
    }

    /// Exit codes come back as `Code`, for argv and shell commands alike.
    #[tokio::test]
    async fn exit_codes() {
        let argv = ChildSpec {
            command: Command::Argv(vec!["sh".into(), "-c".into(), "exit 3".into()]),
            ..shell("")
        };
        assert_eq!(run(&argv).await, ExitKind::Code(3));
        assert_eq!(run(&shell("true")).await, ExitKind::Code(0));
        assert!(ExitKind::Code(0).success() && !ExitKind::Code(1).success());
        assert_eq!(ExitKind::Code(3).to_string(), "exit code 3");
    }

    /// A child killed by a signal reports the signal.
    #[tokio::test]
    async fn signal_exit() {
        assert_eq!(
            run(&shell("kill -9 $$")).await,
            ExitKind::Signal(libc::SIGKILL)
        );
        assert_eq!(ExitKind::Signal(9).to_string(), "signal 9 (SIGKILL)");
    }

    /// Every line is logged, in order, inside the caller's span, before `wait` returns.
    #[tokio::test]
    async fn output_lines_in_order_within_span() {
        let (logs, _guard) = Logs::capture();
        let span = tracing::info_span!("run", job = "j", token = 7u64);
        let script = "i=0; while [ $i -lt 200 ]; do echo line$i; i=$((i+1)); done; echo oops >&2; printf tail";
        let status = run(&shell(script)).instrument(span).await;
        assert_eq!(status, ExitKind::Code(0));
        let expected: Vec<String> = (0..200)
            .map(|i| format!("line{i}"))
            .chain(["tail".into()])
            .collect();
        assert_eq!(logs.lines("stdout"), expected);
        assert_eq!(logs.lines("stderr"), ["oops"]);
        let first = &logs.output()[0];
        assert_eq!(
            (&first["job"], &first["token"]),
            (&Value::from("j"), &Value::from(7))
        );
    }

    /// Absurdly long lines are cut at 64 KiB and flagged; invalid UTF-8 is replaced, not fatal.
    #[tokio::test]
    async fn long_lines_are_cut_and_bytes_lossy() {
        let (logs, _guard) = Logs::capture();
        let script = r"head -c 100000 /dev/zero | tr '\0' a; echo; printf 'x\377y\r\n'";
        assert_eq!(run(&shell(script)).await, ExitKind::Code(0));
        let output = logs.output();
        assert_eq!(output.len(), 2);
        assert_eq!(
            output[0]["line"].as_str().map(str::len),
            Some(MAX_LINE_BYTES)
        );
        assert_eq!(output[0]["truncated"], true);
        assert_eq!(output[1]["line"], "x\u{FFFD}y");
        assert!(output[1].get("truncated").is_none());
    }

    /// With a tail, the last bytes of each stream are kept (more than the bound was printed), and what
    /// was printed is still logged in full; without one, nothing is kept.
    #[tokio::test]
    async fn tails_keep_the_last_bytes_of_each_stream() {
        let (logs, _guard) = Logs::capture();
        let script = "i=0; while [ $i -lt 300 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done; printf end";
        let mut child = RunningChild::spawn_keeping(&shell(script), 20).expect("spawns");
        assert_eq!(child.wait().await.expect("waits"), ExitKind::Code(0));
        let tails = child.tails();
        assert_eq!(tails.stdout.as_deref(), Some("97\nout298\nout299\nend"));
        assert_eq!(tails.stderr.as_deref(), Some("rr297\nerr298\nerr299\n"));
        assert_eq!(logs.lines("stdout").len(), 301);

        let mut quiet = RunningChild::spawn_keeping(&shell("echo only >&2"), 20).expect("spawns");
        quiet.wait().await.expect("waits");
        let only_err = OutputTails {
            stdout: None,
            stderr: Some("only\n".into()),
        };
        assert_eq!(quiet.tails(), only_err);

        let mut off = RunningChild::spawn(&shell("echo out; echo err >&2")).expect("spawns");
        off.wait().await.expect("waits");
        assert_eq!(off.tails(), OutputTails::default());
    }

    /// A program without a directory is found on the child's own `PATH` (not the worker's), as execvp
    /// would, so that it can be started without a fork; one found nowhere fails as before.
    #[tokio::test]
    async fn programs_are_found_on_the_childs_path() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let tool = dir.path().join("only-here");
        std::fs::write(&tool, "#!/bin/sh\necho found\n").expect("writes");
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let path = format!("/nonexistent:{}:/bin:/usr/bin", dir.path().display());
        let spec = ChildSpec {
            command: Command::Argv(vec!["only-here".into()]),
            env: vec![("PATH".into(), path.into())],
            workdir: None,
            stop_grace: Duration::from_secs(1),
        };
        assert_eq!(resolve("only-here", &spec), tool);
        assert_eq!(resolve("/bin/sh", &spec), PathBuf::from("/bin/sh"));
        let (logs, _guard) = Logs::capture();
        assert_eq!(run(&spec).await, ExitKind::Code(0));
        assert_eq!(logs.lines("stdout"), ["found"]);
        let without_path = ChildSpec {
            env: Vec::new(),
            ..spec.clone()
        };
        assert_eq!(
            resolve("only-here", &without_path),
            PathBuf::from("only-here")
        );
        assert_eq!(
            resolve("sh", &without_path).parent(),
            Some(std::path::Path::new("/bin"))
        );
        let error = RunningChild::spawn(&without_path).expect_err("not on /bin:/usr/bin");
        assert!(
            error
                .to_string()
                .starts_with("cannot start only-here: No such file"),
            "{error}"
        );
    }

    /// The spec's env, nothing else of the worker's, and the working directory reach the child.
    #[tokio::test]
    async fn env_and_workdir() {
        let (logs, _guard) = Logs::capture();
        let spec = ChildSpec {
            // Not the test's HOME, which it has (in any sane test environment).
            env: vec![("A".into(), "a".into()), ("B".into(), "b".into())],
            workdir: Some(PathBuf::from("/")),
            ..shell("echo $A $B $(pwd) [$HOME]")
        };
        let mut child = RunningChild::spawn(&spec).expect("spawns");
        child.wait().await.expect("waits");
        assert_eq!(logs.lines("stdout"), ["a b / []"]);
    }

    /// A child that ignores SIGTERM is SIGKILLed once the grace has passed.
    #[tokio::test]
    async fn stop_escalates_to_sigkill() {
        let (logs, _guard) = Logs::capture();
        let mut child =
            RunningChild::spawn(&shell("trap '' TERM; echo ready; sleep 100")).expect("spawns");
        logs.first_line("stdout").await;
        let started = Instant::now();
        let status = child.stop(Duration::from_millis(300)).await.expect("stops");
        assert_eq!(status, ExitKind::Signal(libc::SIGKILL));
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    /// A child that honours SIGTERM ends by it, well within the grace.
    #[tokio::test]
    async fn stop_with_sigterm() {
        let mut child = RunningChild::spawn(&shell("exec sleep 100")).expect("spawns");
        let started = Instant::now();
        let status = child.stop(Duration::from_secs(10)).await.expect("stops");
        assert_eq!(status, ExitKind::Signal(libc::SIGTERM));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            child.stop(Duration::ZERO).await.expect("idempotent"),
            status
        );
    }

    /// Stopping reaches the grandchildren of `/bin/sh -c`, even ones that ignore SIGTERM.
    #[tokio::test]
    async fn stop_kills_the_whole_tree() {
        let (logs, _guard) = Logs::capture();
        let script = "(trap '' TERM; exec sleep 100) & echo $!; wait";
        let mut child = RunningChild::spawn(&shell(script)).expect("spawns");
        let grandchild: i32 = logs.first_line("stdout").await.parse().expect("a pid");
        child.stop(Duration::from_millis(200)).await.expect("stops");
        assert_dies(grandchild).await;
    }

    /// `wait` may be cancelled (as in `select!`) and called again.
    #[tokio::test]
    async fn wait_is_cancel_safe() {
        let mut child = RunningChild::spawn(&shell("sleep 0.3; exit 4")).expect("spawns");
        let timed_out = tokio::time::timeout(Duration::from_millis(50), child.wait()).await;
        assert!(timed_out.is_err());
        assert_eq!(child.wait().await.expect("waits"), ExitKind::Code(4));
        assert_eq!(child.wait().await.expect("again"), ExitKind::Code(4));
    }

    /// `kill_now` and dropping both kill the whole group at once.
    #[tokio::test]
    async fn kill_now_and_drop_kill_the_group() {
        let (logs, _guard) = Logs::capture();
        let mut child = RunningChild::spawn(&shell("sleep 100 & echo $!; wait")).expect("spawns");
        let grandchild: i32 = logs.first_line("stdout").await.parse().expect("a pid");
        child.kill_now();
        assert_eq!(
            child.wait().await.expect("waits"),
            ExitKind::Signal(libc::SIGKILL)
        );
        assert_dies(grandchild).await;

        let (logs, _guard) = Logs::capture();
        let child = RunningChild::spawn(&shell("sleep 100 & echo $!; wait")).expect("spawns");
        let grandchild: i32 = logs.first_line("stdout").await.parse().expect("a pid");
        drop(child);
        assert_dies(grandchild).await;
    }

    /// Spawn failures name the program (and working directory) and the OS error.
    #[tokio::test]
    async fn spawn_errors_name_the_program() {
        let spec = ChildSpec {
            command: Command::Argv(vec!["/nope".into()]),
            ..shell("")
        };
        let error = RunningChild::spawn(&spec).expect_err("no such program");
        assert!(
            error
                .to_string()
                .starts_with("cannot start /nope: No such file or directory"),
            "{error}"
        );

        let spec = ChildSpec {
            workdir: Some(PathBuf::from("/nonexistent-dir")),
            ..shell("true")
        };
        let error = RunningChild::spawn(&spec).expect_err("no such directory");
        assert!(
            error.to_string().contains("(in /nonexistent-dir)"),
            "{error}"
        );

        let empty = ChildSpec {
            command: Command::Argv(Vec::new()),
            ..shell("")
        };
        assert!(matches!(
            RunningChild::spawn(&empty),
            Err(ProcessError::EmptyCommand)
        ));
    }
}
