//! Spawning and ending the processes a test starts, so that none of them outlives the test binary.
//!
//! `Drop` handles cover a passing or panicking test. A test binary that is itself killed runs no
//! destructors, so on Linux every child also asks the kernel for SIGKILL when its parent dies
//! (`PR_SET_PDEATHSIG`). That signal fires when the *thread* that forked the child exits, and test threads
//! come and go (a node restarted from a `spawn_blocking` task would die with that task's thread), so all
//! children are forked by one spawner thread that lives as long as the test binary.

use std::io;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` from the long-lived spawner thread; the child is SIGKILLed if the test binary dies.
pub fn spawn(mut command: Command) -> io::Result<Child> {
    die_with_parent(&mut command);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, inbox) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("support-spawner".into())
            .spawn(move || {
                for (mut command, reply) in inbox {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the spawner thread");
        Mutex::new(requests)
    });
    let (reply, answer) = mpsc::channel();
    // A test that panicked while sending cannot leave the sender half-used: ignore the poison.
    let requests = spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    requests
        .send((command, reply))
        .expect("the spawner thread never exits");
    answer.recv().expect("the spawner thread always replies")
}

#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: getpid is async-signal-safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: prctl and getppid are async-signal-safe and touch no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::other("the test process exited"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// Sends `signal` to `pid`; a process that is already gone is not an error. For `SIGSTOP`, returns once
/// every thread of the process is stopped (up to 2 s): `kill` only marks the signal pending, and a
/// thread busy on another core (a JVM's network thread) could otherwise still answer a request sent
/// right after — a "hung" member that answers.
pub fn signal(pid: u32, signal: i32) {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory effects; the pid is our own unreaped child, so it cannot be reused.
    unsafe {
        libc::kill(raw, signal);
    }
    if signal == libc::SIGSTOP {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !all_threads_stopped(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether every thread of `pid` is stopped (`T` in `/proc/<pid>/task/*/stat`); true for a process
/// that is gone or cannot be read (nothing to wait for).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.filter_map(Result::ok).all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                Some(matches!(
                    rest.trim_start().chars().next(),
                    Some('T' | 't' | 'Z' | 'X')
                ))
            })
            .unwrap_or(true)
    })
}

/// Waits up to `timeout` for `child` to exit, polling (std has no wait with a timeout).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("cannot wait for child {}: {e}", child.id()),
        }
    }
}

/// Ends `child` for good: SIGCONT (a stopped process would not die until continued on some systems),
/// SIGKILL, then reap it.
pub fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    signal(child.id(), libc::SIGCONT);
    signal(child.id(), libc::SIGKILL);
    child.wait().ok()
}

/// A process found under another one, identified by pid and start time so that a recycled pid is never
/// mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    start_time: u64,
}

impl Process {
    /// SIGKILLs the process if it is still the one that was found.
    pub fn kill(self) {
        if stat(self.pid).is_some_and(|(_, start)| start == self.start_time) {
            // SAFETY: kill has no memory effects; the start time check rules out a recycled pid.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
    }
}

/// Every living descendant of `root` (children, grandchildren, ...), read from `/proc`.
///
/// Used to clean up a worker's jobs, which run in process groups of their own and would survive it.
pub fn descendants(root: u32) -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let all: Vec<(i32, i32, u64)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| stat(pid).map(|(ppid, start)| (pid, ppid, start)))
        .collect();
    let mut found: Vec<Process> = Vec::new();
    let mut parents = vec![i32::try_from(root).unwrap_or(-1)];
    while let Some(parent) = parents.pop() {
        for &(pid, ppid, start_time) in &all {
            if ppid == parent && !found.iter().any(|p| p.pid == pid) {
                found.push(Process { pid, start_time });
                parents.push(pid);
            }
        }
    }
    found
}

/// `(ppid, start time)` of `pid` from `/proc/<pid>/stat`, or `None` if it is gone.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the fields after its last ')' do not.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name: state (3), ppid (4), ..., starttime (22).
    let ppid = fields.get(1)?.parse().ok()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some((ppid, start_time))
}
