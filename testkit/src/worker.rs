//! [`Worker`]: one `redcron run` process of the built binary, its JSON log captured for assertions.
//!
//! Tests observe a worker only from outside, as an operator would: through its log lines (by their
//! stable `event` names), its exit status and the files its jobs write. A background thread collects
//! stdout line by line, so a test can wait for an event while the worker runs. Dropping a worker SIGKILLs
//! it and every process under it — its jobs run in process groups of their own and would otherwise
//! outlive it — and, if the test is failing, prints what the worker logged.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::children::{self, Process};

/// Options for a [`Worker`]; start with [`Worker::builder`].
#[derive(Debug, Clone)]
pub struct WorkerBuilder {
    config: PathBuf,
    binary: Option<PathBuf>,
    env: Vec<(String, String)>,
    args: Vec<String>,
    open_files: Option<u64>,
    user: Option<(u32, u32)>,
    stdout: Option<PathBuf>,
}

impl WorkerBuilder {
    /// Runs this binary instead of [`crate::redcron_binary`] (the one cargo built beside the caller).
    pub fn binary(mut self, binary: impl AsRef<Path>) -> Self {
        self.binary = Some(binary.as_ref().to_owned());
        self
    }

    /// Sets an environment variable of the worker (it otherwise inherits the test's environment).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds an argument after `run -c <config> --log-format json`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Starts the worker with this soft and hard limit of open files (`RLIMIT_NOFILE`), as a host with a
    /// low `ulimit -n` would.
    pub fn open_files_limit(mut self, limit: u64) -> Self {
        self.open_files = Some(limit);
        self
    }

    /// Runs the worker as this user and group (the test runs as root), with no supplementary groups.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// Sends the worker's stdout (its log) to this file or FIFO, opened for writing by the worker's
    /// start, instead of to the test: [`Worker::logs`] then has nothing.
    pub fn stdout_to(mut self, path: impl AsRef<Path>) -> Self {
        self.stdout = Some(path.as_ref().to_owned());
        self
    }

    /// Runs the worker (and its jobs) with a fake clock through libfaketime, e.g. `"+1h"` or `"@2024-03-31 01:59:50"`.
    ///
    /// Preloaded directly rather than through the `faketime` command, which would stand between the test
    /// and the worker as a parent process that does not pass signals on. Only the wall clock is faked:
    /// a host's monotonic and boot clocks never jump, and the lease watchdog's `timerfd` on
    /// `CLOCK_BOOTTIME` is armed with relative values, which libfaketime leaves alone (it shifts
    /// absolute timers by the skew).
    pub fn faketime(self, spec: &str) -> Self {
        crate::require_program("faketime", "faketime");
        let library =
            libfaketime().expect("`faketime` is installed but libfaketime.so.1 was not found");
        self.env("LD_PRELOAD", &library.to_string_lossy())
            .env("FAKETIME", spec)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    }

    /// Starts the worker in the config file's directory.
    pub fn spawn(self) -> Worker {
        let binary = self.binary.unwrap_or_else(crate::redcron_binary);
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("-c")
            .arg(&self.config)
            .args(["--log-format", "json"])
            .args(&self.args)
            .env("RUST_BACKTRACE", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = self.user {
            use std::os::unix::process::CommandExt as _;
            command.uid(uid).gid(gid);
        }
        if let Some(path) = &self.stdout {
            let sink = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .unwrap_or_else(|e| panic!("cannot open {} for the worker: {e}", path.display()));
            command.stdout(sink);
        }
        if let Some(limit) = self.open_files {
            use std::os::unix::process::CommandExt as _;
            let limit = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            // SAFETY: setrlimit is async-signal-safe and reads only the struct moved into the closure.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(dir) = self
            .config
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
        {
            command.current_dir(dir);
        }
        let mut child =
            children::spawn(command).unwrap_or_else(|e| panic!("cannot start the worker: {e}"));
        let output = Arc::new(Output::default());
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let readers = [
            std::thread::spawn({
                let output = Arc::clone(&output);
                move || output.read_stdout(stdout)
            }),
            std::thread::spawn({
                let output = Arc::clone(&output);
                move || output.read_stderr(stderr)
            }),
        ];
        Worker {
            pid: child.id(),
            child,
            output,
            _readers: readers,
            orphans: Vec::new(),
        }
    }
}

/// A running `redcron run` process; SIGKILLed with everything under it on drop.
pub struct Worker {
    pid: u32,
    child: Child,
    output: Arc<Output>,
    /// The threads collecting stdout and stderr; they end when the pipes close.
    _readers: [JoinHandle<()>; 2],
    /// Processes that were under the worker when it was killed: its orphaned jobs, killed on drop.
    orphans: Vec<Process>,
}

impl Worker {
    /// Runs `redcron run -c <config> --log-format json` with `env` added to the test's environment.
    pub fn spawn(config: impl AsRef<Path>, env: &[(&str, &str)]) -> Worker {
        let builder = env
            .iter()
            .fold(Worker::builder(config), |builder, (key, value)| {
                builder.env(key, value)
            });
        builder.spawn()
    }

    pub fn builder(config: impl AsRef<Path>) -> WorkerBuilder {
        WorkerBuilder {
            config: config.as_ref().to_owned(),
            binary: None,
            env: Vec::new(),
            args: Vec::new(),
            open_files: None,
            user: None,
            stdout: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the worker process.
    pub fn signal(&mut self, signal: i32) {
        // Once reaped, the pid may belong to someone else: signal only a child not yet waited for.
        if matches!(self.child.try_wait(), Ok(None)) {
            children::signal(self.pid, signal);
        }
    }

    /// Freezes the worker (SIGSTOP): its leases stop being renewed while it believes it holds them.
    pub fn stop(&mut self) {
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a worker frozen by [`Self::stop`].
    pub fn cont(&mut self) {
        self.signal(libc::SIGCONT);
    }

    /// Crashes the worker (SIGKILL) and reaps it. Its running jobs are left running, as after a real
    /// crash; they are killed when this value is dropped.
    pub fn kill(&mut self) {
        self.orphans.extend(children::descendants(self.pid));
        children::kill_and_reap(&mut self.child);
    }

    /// Waits up to `timeout` for the worker to exit; once it has, also (at most 2 s) for the reader
    /// threads to take in the rest of its stdout and stderr, so that [`Self::stderr`] and
    /// [`Self::lines`] then hold everything it wrote (a reader descheduled on a loaded machine would
    /// otherwise leave its last error out).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = children::wait_timeout(&mut self.child, timeout)?;
        self.output.wait_closed(Duration::from_secs(2));
        Some(status)
    }

    /// Every stdout line so far, as written.
    pub fn lines(&self) -> Vec<String> {
        self.output.lock().stdout.clone()
    }

    /// Every log event so far; panics if a stdout line is not a JSON object (the log format's promise).
    pub fn logs(&self) -> Vec<Value> {
        parse(&self.output.lock().stdout)
    }

    /// The events named `name` so far.
    pub fn events(&self, name: &str) -> Vec<Value> {
        self.logs()
            .into_iter()
            .filter(|event| event["event"] == name)
            .collect()
    }

    /// What the worker wrote to stderr so far (panics, errors before logging was set up).
    pub fn stderr(&self) -> String {
        self.output.lock().stderr.clone()
    }

    /// The first event named `name`, waiting up to `timeout` for it; `None` if it did not come (or the
    /// worker closed its stdout first).
    pub fn wait_for_event(&self, name: &str, timeout: Duration) -> Option<Value> {
        self.wait_for(timeout, |event| event["event"] == name)
    }

    /// The first event matching `pred`, waiting up to `timeout` for it, as [`Self::wait_for_event`].
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        let mut state = self.output.lock();
        let mut seen = 0;
        loop {
            if let Some(found) = parse(&state.stdout[seen..]).into_iter().find(&pred) {
                return Some(found);
            }
            seen = state.stdout.len();
            let left = deadline.saturating_duration_since(Instant::now());
            if state.stdout_closed || left.is_zero() {
                return None;
            }
            state = match self.output.changed.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.orphans.extend(children::descendants(self.pid));
        children::kill_and_reap(&mut self.child);
        self.orphans.iter().for_each(|process| process.kill());
        // Let the reader take in what the worker wrote before dying; not joined, since a process that
        // escaped the clean-up could hold the pipe open for ever.
        self.output.wait_closed(Duration::from_secs(2));
        if std::thread::panicking() {
            let state = self.output.lock();
            let tail = state.stdout.len().saturating_sub(200);
            eprintln!("--- worker {} stdout (last 200 lines) ---", self.pid);
            state.stdout[tail..]
                .iter()
                .for_each(|line| eprintln!("{line}"));
            eprintln!("--- worker {} stderr ---\n{}", self.pid, state.stderr);
        }
    }
}

/// A worker's captured output, filled by the reader threads.
#[derive(Default)]
struct Output {
    state: Mutex<OutputState>,
    changed: Condvar,
}

#[derive(Default)]
struct OutputState {
    stdout: Vec<String>,
    stderr: String,
    stdout_closed: bool,
    stderr_closed: bool,
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, OutputState> {
        // Only the reader threads and the test write it, and neither panics while holding the lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits up to `timeout` until both pipes have been read to their end.
    fn wait_closed(&self, timeout: Duration) {
        let state = self.lock();
        let _ = self.changed.wait_timeout_while(state, timeout, |state| {
            !(state.stdout_closed && state.stderr_closed)
        });
    }

    fn read_stdout(&self, stdout: Option<impl Read>) {
        if let Some(stdout) = stdout {
            let mut reader = BufReader::new(stdout);
            let mut line = Vec::new();
            while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&line)
                    .trim_end_matches(['\n', '\r'])
                    .to_owned();
                self.lock().stdout.push(text);
                self.changed.notify_all();
                line.clear();
            }
        }
        self.lock().stdout_closed = true;
        self.changed.notify_all();
    }

    fn read_stderr(&self, stderr: Option<impl Read>) {
        if let Some(mut stderr) = stderr {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                self.lock()
                    .stderr
                    .push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        }
        self.lock().stderr_closed = true;
        self.changed.notify_all();
    }
}

/// Parses log lines; a line that is not a JSON object fails the test.
fn parse(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(value @ Value::Object(_)) => value,
            _ => panic!("worker log line is not a JSON object: {line:?}"),
        })
        .collect()
}

/// libfaketime's preload library (the multi-threaded build when present), as Debian installs it.
pub fn libfaketime() -> Option<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/usr/lib/faketime"),
        PathBuf::from("/usr/local/lib/faketime"),
    ];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(entries.filter_map(|e| Some(e.ok()?.path().join("faketime"))));
    }
    ["libfaketimeMT.so.1", "libfaketime.so.1"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
        .find(|path| path.is_file())
}
