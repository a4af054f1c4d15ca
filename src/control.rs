//! The worker's one control channel: every outside intent — reload the config, drain, stop now — arrives
//! here, and the worker's loop takes it from one place ([`Control::next`]).
//!
//! As in mini-redis, the worker is handed its control instead of building it, so tests and the CLI drive
//! the same loop. Signals are one source ([`install_signals`]: SIGINT and SIGTERM drain, a second one stops
//! at once, SIGHUP reloads); the config file's watcher is another ([`ConfigWatch`]). Draining and stopping
//! also reach every task of the worker through the two-stage [`Shutdown`] they hold.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::shutdown::Shutdown;

/// What the outside asks of the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intent {
    /// Read the config file again (`why`: `SIGHUP`, `file changed`): apply it if it is valid, keep the
    /// running config if it is not.
    Reload { why: &'static str },
    /// Stop taking ticks; let running jobs finish within the shutdown grace.
    Drain,
}

/// The worker's end of the control channel.
pub struct Control {
    shutdown: Shutdown,
    sender: mpsc::UnboundedSender<Intent>,
    intents: mpsc::UnboundedReceiver<Intent>,
}

/// A handle that sends intents to the worker; cheap to clone.
#[derive(Clone)]
pub struct ControlHandle {
    shutdown: Shutdown,
    sender: mpsc::UnboundedSender<Intent>,
}

impl Control {
    /// A control channel for a worker that stops through `shutdown`.
    pub fn new(shutdown: Shutdown) -> Control {
        let (sender, intents) = mpsc::unbounded_channel();
        Control {
            shutdown,
            sender,
            intents,
        }
    }

    /// A handle to send intents with.
    pub fn handle(&self) -> ControlHandle {
        ControlHandle {
            shutdown: self.shutdown.clone(),
            sender: self.sender.clone(),
        }
    }

    /// The shutdown every task of the worker watches.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// The next intent: a drain as soon as a shutdown was requested (and from then on), else the next
    /// reload asked for.
    pub async fn next(&mut self) -> Intent {
        if self.shutdown.is_requested() {
            return Intent::Drain;
        }
        tokio::select! {
            () = self.shutdown.graceful() => Intent::Drain,
            intent = self.intents.recv() => intent.unwrap_or(Intent::Drain),
        }
    }
}

impl ControlHandle {
    /// Asks the worker to reload its config.
    pub fn reload(&self, why: &'static str) {
        let _ = self.sender.send(Intent::Reload { why });
    }

    /// Asks the worker to drain (the first request) or to stop at once (any later one).
    pub fn stop(&self) {
        self.shutdown.request();
    }
}

/// Routes SIGINT and SIGTERM to [`ControlHandle::stop`] and SIGHUP to a reload, for as long as the
/// runtime runs. Must be called inside a Tokio runtime.
pub fn install_signals(handle: ControlHandle) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(()) = interrupt.recv() => handle.stop(),
                Some(()) = terminate.recv() => handle.stop(),
                Some(()) = hangup.recv() => handle.reload("SIGHUP"),
                else => return,
            }
        }
    });
    Ok(())
}

/// How often the config file is looked at.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The config file's watcher: asks for a reload whenever the file changes — its contents, or the file
/// it names (an editor's write-then-rename, a Kubernetes ConfigMap's symlink swap). A change is reported
/// once, however it was made, and only once the new version has stood still for a whole
/// [`WATCH_EVERY`]: a file rewritten in place is empty or half-written for a moment, and a reload of that
/// moment could apply a job cut short (its command truncated to a valid prefix) as a changed job.
///
/// Its first look is taken by [`ConfigWatch::look`], *before* the worker loads the config: a change made
/// between the load and the watcher's start is then a change from the first look, reloaded, where a
/// first look after it would have taken the new file for the one loaded and never reloaded it.
pub struct ConfigWatch {
    path: PathBuf,
    seen: Seen,
    /// The version reloaded last (at first: the one seen before the load).
    applied: Option<u64>,
}

impl ConfigWatch {
    /// Takes the first look at the file at `path`; call it before loading the config from there.
    pub fn look(path: PathBuf) -> ConfigWatch {
        let mut seen = Seen::default();
        let applied = seen.fingerprint(&path);
        ConfigWatch {
            path,
            seen,
            applied,
        }
    }

    /// Watches the file every [`WATCH_EVERY`] from now on, in a task of its own that stops with the
    /// shutdown. Must be called inside a Tokio runtime.
    pub fn start(self, handle: ControlHandle) {
        let ConfigWatch {
            path,
            mut seen,
            mut applied,
        } = self;
        let path = std::sync::Arc::new(path);
        tokio::spawn(async move {
            // A version that differs from the applied one, seen at the previous look: reloaded if it is
            // still there at the next.
            let mut candidate = None;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(WATCH_EVERY) => {}
                    () = handle.shutdown.graceful() => return,
                }
                // A look reads the file's metadata, and the file when that changed: off the runtime's
                // threads, as a slow file system would hold them.
                let at = std::sync::Arc::clone(&path);
                let looked = tokio::task::spawn_blocking(move || {
                    let now = seen.fingerprint(&at);
                    (seen, now)
                });
                let Ok((back, now)) = looked.await else {
                    return;
                };
                seen = back;
                // A file that cannot be read is being replaced: wait for its next readable version.
                let Some(now) = now else {
                    candidate = None;
                    continue;
                };
                if applied == Some(now) {
                    candidate = None;
                } else if candidate == Some(now) {
                    applied = Some(now);
                    candidate = None;
                    handle.reload("file changed");
                } else {
                    candidate = Some(now);
                }
            }
        });
    }
}

/// The file as last read: its metadata and the hash of its contents, and whether that metadata is
/// trusted to stand for the contents. It is once two reads a look apart (a whole [`WATCH_EVERY`]) found
/// the same metadata and the same contents: a file rewritten within one tick of the filesystem's clock
/// (as git's "racily clean" files) can keep its times, and no clock is asked whether the file is old enough
/// (the worker's may be skewed, a file server's differ, an mtime be set back).
#[derive(Default)]
struct Seen {
    last: Option<(FileStamp, u64)>,
    trusted: bool,
}

/// What changes whenever a file's contents may have: which file (device, inode: a replacement or a
/// symlink swap), its size, and its modification and change times. The change time cannot be set by a
/// user, so even a write that puts the modification time back is seen.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Seen {
    /// What identifies the file's current version: a hash of its contents (`None` while it cannot be read,
    /// as in the middle of a replacement). Once trusted, the contents are read again only when the file's
    /// [`FileStamp`] changed: a config of thousands of jobs is a megabyte to read and hash every second.
    fn fingerprint(&mut self, path: &std::path::Path) -> Option<u64> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok()?;
        let stamp = FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        };
        match self.last {
            Some((last, hash)) if self.trusted && last == stamp => Some(hash),
            _ => {
                let bytes = std::fs::read(path).ok()?;
                let hash = crate::lock::order::fnv1a(&bytes);
                self.trusted = self.last == Some((stamp, hash));
                self.last = Some((stamp, hash));
                Some(hash)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config changed after the watcher's first look but before it started (a worker loading its file
    /// while an operator replaces it) is reloaded: the first look, not the start, is what was loaded.
    #[tokio::test]
    async fn a_change_between_the_first_look_and_the_start_is_reloaded() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("jobs.yaml");
        std::fs::write(&path, "jobs: {old: {}}\n").expect("write");
        let watch = ConfigWatch::look(path.clone());
        let temp = dir.path().join("jobs.yaml.new");
        std::fs::write(&temp, "jobs: {new: {}}\n").expect("write");
        std::fs::rename(&temp, &path).expect("rename");
        let mut control = Control::new(Shutdown::new());
        watch.start(control.handle());
        let intent = tokio::time::timeout(Duration::from_secs(30), control.next())
            .await
            .expect("a reload within two looks");
        assert_eq!(
            intent,
            Intent::Reload {
                why: "file changed"
            }
        );
    }
}
