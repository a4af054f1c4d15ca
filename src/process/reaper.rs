//! The job descendants that left their process group: the worker as their child subreaper.
//!
//! `killpg` reaches a job's process group only, and a descendant that calls `setsid` (or `setpgid`)
//! leaves it. So the worker makes itself a child subreaper ([`become_subreaper`]): a process orphaned by
//! its parent's exit is then reparented to the worker instead of to init, and every process descended
//! from a job stays a descendant of the worker. An *orphan* is a child of the worker that the worker did
//! not spawn itself ([`Own`] keeps the ones it did). Once a job's leader has exited, every process left of
//! its tree is in its group or in the subtree of an orphan: [`super::RunningChild`] ends both, and an
//! orphan's children, orphaned in turn when it dies, are found by the next scan.
//!
//! Orphans are told apart by the run they came from: the value of [`RUN_MARKER`] in their environment,
//! which every job gets and its descendants inherit. One that cleared it (or whose environment cannot be
//! read: a set-uid program) belongs to any run that ends, and to the shutdown's [`sweep`].
//!
//! Finding them means reading `/proc/<pid>/stat` of every process, so scans are coalesced: one thread
//! scans at most every [`MIN_GAP`], for every run that asked since the last scan ([`Scanner::after_now`]).
//! It also reaps the orphans that died — a subreaper must wait for them, or they stay zombies — each by
//! its pid, never with `waitpid(-1)`, which would take the exit status of a child tokio waits for.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The variable of a job's environment that names its run, inherited by its descendants.
pub(crate) const RUN_MARKER: &str = "REDCRON_RUN_ID";

/// The shortest time between two scans of `/proc`: a herd's thousand exits a second cost 20 scans.
const MIN_GAP: Duration = Duration::from_millis(50);

/// How much of an orphan's environment is read to find [`RUN_MARKER`]; past it, the orphan is unmarked.
const MAX_ENVIRON: usize = 256 * 1024;

/// Whether this process is a subreaper: only then are orphans the worker's children, and only then is
/// scanning for them meaningful (a test process's own children are not orphans of a job).
static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// Makes this process the child subreaper of its descendants (`PR_SET_CHILD_SUBREAPER`), so that the
/// processes a job leaves behind can be found and ended (see the module's doc).
pub(crate) fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    SUBREAPER.store(true, Ordering::SeqCst);
    Ok(())
}

/// The children the worker spawned itself, which are not orphans.
///
/// A scan reads `/proc` first and consults this set after, under the write side of the gate, while every
/// spawn holds the read side from before its `fork` until its pid is in the set: so a child the scan saw
/// is in the set by the time it is consulted, and a fresh child is never taken for an orphan.
pub(crate) struct Own {
    gate: RwLock<()>,
    pids: Mutex<BTreeSet<u32>>,
}

static OWN: Own = Own {
    gate: RwLock::new(()),
    pids: Mutex::new(BTreeSet::new()),
};

impl Own {
    /// Runs `spawn` (which returns the child's pid when it started one) so that no scan takes the child
    /// for an orphan.
    pub(crate) fn spawn<T>(spawn: impl FnOnce() -> (T, Option<u32>)) -> T {
        let _gate = OWN
            .gate
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (value, pid) = spawn();
        if let Some(pid) = pid {
            OWN.lock().insert(pid);
        }
        value
    }

    /// Forgets a child that was reaped (or handed to tokio's reaping of dropped children).
    pub(crate) fn forget(pid: u32) {
        OWN.lock().remove(&pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.pids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A live orphan found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Orphan {
    pub(crate) pid: u32,
    /// Whether it leads its own process group (as after `setsid`): then its group is signalled with it.
    pub(crate) leads_group: bool,
    /// The [`RUN_MARKER`] of its environment; `None` when it has none or it cannot be read.
    pub(crate) run: Option<String>,
}

impl Orphan {
    /// Whether it is the run `run`'s to end: marked with it, or unmarked.
    pub(crate) fn belongs_to(&self, run: &str) -> bool {
        self.run.as_deref().is_none_or(|marker| marker == run)
    }

    /// Sends `signal` to it, and to its group when it leads one. Its pid is not reused before the scanner
    /// reaps it, which only a scan after its death does.
    pub(crate) fn signal(&self, signal: i32) {
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return;
        };
        // SAFETY: kill/killpg have no memory effects; ESRCH (already gone) is harmless.
        unsafe {
            if self.leads_group {
                libc::killpg(pid, signal);
            }
            libc::kill(pid, signal);
        }
    }
}

/// What one scan found: the live orphans, and which requests it answers.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Every request numbered up to this one was made before this scan started.
    answers: u64,
    pub(crate) orphans: Vec<Orphan>,
}

/// The scanning thread's inbox and its published result.
pub(crate) struct Scanner {
    /// The number of the last request made.
    requested: Mutex<u64>,
    wake: Condvar,
    latest: watch::Sender<Arc<Scan>>,
}

impl Scanner {
    /// The scanner of this process, started on first use; `None` unless this process is a subreaper.
    pub(crate) fn get() -> Option<&'static Scanner> {
        if !SUBREAPER.load(Ordering::SeqCst) {
            return None;
        }
        static SCANNER: OnceLock<&'static Scanner> = OnceLock::new();
        Some(SCANNER.get_or_init(|| {
            let scanner: &'static Scanner = Box::leak(Box::new(Scanner {
                requested: Mutex::new(0),
                wake: Condvar::new(),
                latest: watch::Sender::new(Arc::new(Scan::default())),
            }));
            let started = std::thread::Builder::new()
                .name("reaper".to_string())
                .spawn(move || scanner.serve());
            if started.is_err() {
                // Without the thread nothing answers: scan on the caller's thread instead (see `after_now`).
                scanner.latest.send_replace(Arc::new(Scan {
                    answers: u64::MAX,
                    orphans: Vec::new(),
                }));
            }
            scanner
        }))
    }

    /// The result of a scan that started after this call: it sees every orphan made before it.
    pub(crate) async fn after_now(&self) -> Arc<Scan> {
        let ticket = {
            let mut requested = self.lock();
            *requested += 1;
            *requested
        };
        self.wake.notify_one();
        let mut latest = self.latest.subscribe();
        let answered = latest.wait_for(|scan| scan.answers >= ticket).await;
        match answered {
            Ok(scan) if scan.answers != u64::MAX => Arc::clone(&scan),
            // No scanning thread: scan here (blocking, but only ever when a thread could not start).
            _ => Arc::new(Scan {
                answers: ticket,
                orphans: scan_now(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.requested
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The scanning thread: waits for a request (or, while orphans live, [`IDLE_SCAN`] at most, to reap
    /// those that die unasked), scans, publishes.
    fn serve(&self) {
        /// While orphans are known, how often they are looked at again though nobody asked.
        const IDLE_SCAN: Duration = Duration::from_secs(1);
        let mut answered = 0;
        let mut last = Instant::now() - MIN_GAP;
        loop {
            let target = {
                let mut requested = self.lock();
                while *requested == answered {
                    let idle = self.latest.borrow().orphans.is_empty();
                    if idle {
                        requested = self.wake.wait(requested).unwrap_or_else(|p| p.into_inner());
                    } else {
                        let (guard, timeout) = self
                            .wake
                            .wait_timeout(requested, IDLE_SCAN)
                            .unwrap_or_else(|p| p.into_inner());
                        requested = guard;
                        if timeout.timed_out() {
                            break;
                        }
                    }
                }
                *requested
            };
            std::thread::sleep(MIN_GAP.saturating_sub(last.elapsed()));
            // Requests made during the pause are answered too: the scan starts after them.
            let target = target.max(*self.lock());
            last = Instant::now();
            let orphans = scan_now();
            answered = target;
            self.latest.send_replace(Arc::new(Scan {
                answers: target,
                orphans,
            }));
        }
    }
}

/// Reads `/proc` for the children of this process that it did not spawn; reaps the dead ones and
/// returns the live ones.
fn scan_now() -> Vec<Orphan> {
    let me = std::process::id();
    let mut children = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = Stat::read(pid).filter(|stat| stat.ppid == me) {
            children.push((pid, stat));
        }
    }
    {
        let _gate = OWN
            .gate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let own = OWN.lock();
        children.retain(|(pid, _)| !own.contains(pid));
    }
    let mut orphans = Vec::new();
    for (pid, stat) in children {
        if stat.zombie {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                let mut status = 0;
                // SAFETY: waitpid on one pid that is this process's child and not one anything else waits
                // for (it is not in `Own`); WNOHANG never blocks.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            }
            continue;
        }
        orphans.push(Orphan {
            pid,
            leads_group: stat.pgid == pid,
            run: marker(pid),
        });
    }
    orphans
}

/// The fields of `/proc/<pid>/stat` a scan needs.
struct Stat {
    zombie: bool,
    ppid: u32,
    pgid: u32,
}

impl Stat {
    fn read(pid: u32) -> Option<Stat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name is in parentheses and may contain anything, so the fields start after the last.
        let mut fields = text.rsplit_once(')')?.1.split_whitespace();
        let state = fields.next()?;
        let ppid = fields.next()?.parse().ok()?;
        let pgid = fields.next()?.parse().ok()?;
        Some(Stat {
            zombie: state == "Z" || state == "X",
            ppid,
            pgid,
        })
    }
}

/// The value of [`RUN_MARKER`] in `pid`'s environment, from its first [`MAX_ENVIRON`] bytes.
fn marker(pid: u32) -> Option<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut environ = Vec::new();
    file.take(MAX_ENVIRON as u64)
        .read_to_end(&mut environ)
        .ok()?;
    let prefix = format!("{RUN_MARKER}=");
    environ
        .split(|&byte| byte == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .filter(|value| !value.is_empty())
}

/// Ends every orphan left, whatever its run: SIGTERM, then SIGKILL after `grace`; returns once none
/// lives (or `grace` and a second as long again have passed). For the worker's shutdown, after its runs
/// have ended: what they did not claim (a process that cleared its environment) does not outlive it.
pub(crate) async fn sweep(grace: Duration) -> usize {
    let Some(scanner) = Scanner::get() else {
        return 0;
    };
    let started = tokio::time::Instant::now();
    let mut signalled: HashSet<u32> = HashSet::new();
    let mut killed = false;
    loop {
        let scan = scanner.after_now().await;
        if scan.orphans.is_empty() {
            return signalled.len();
        }
        let late = started.elapsed() >= grace;
        if late && started.elapsed() >= grace * 2 + Duration::from_secs(1) {
            return signalled.len();
        }
        for orphan in &scan.orphans {
            if late {
                orphan.signal(libc::SIGKILL);
                killed = true;
            } else if signalled.insert(orphan.pid) {
                orphan.signal(libc::SIGTERM);
            }
            signalled.insert(orphan.pid);
        }
        let pause = if killed {
            MIN_GAP
        } else {
            Duration::from_millis(100)
        };
        tokio::time::sleep(pause).await;
    }
}
