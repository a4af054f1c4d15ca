//! The worker's long-lived background tasks — the trigger poller, the heartbeat, the clock task, the
//! missed-tick checker, the history writer — run under [`spawn`], so that one that panics is never
//! silently lost.
//!
//! [`spawn`] makes the task again whenever it panics: the panic is logged as an ERROR
//! (`worker.task_panicked`, with the task's name and the panic's message), and the new task starts after
//! a backoff (1 s, doubling up to a minute; back to 1 s once a task ran for 5 minutes), so a task that
//! panics at once on every start costs a line a minute, not a busy loop. A task starts afresh: what it
//! held in memory (the requests it raced, the ticks it was to check) is gone, and what it shares with the
//! worker (its queue) is kept. Once the worker is stopping, a task that panics is logged and not started
//! again: it was about to end anyway, and the worker's exit must not wait for it. The short-lived tasks
//! (the race of a batch) are not restarted, but their panics are logged the same way ([`log_panic`]).

use std::future::Future;
use std::time::Duration;

use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tracing::error;

use crate::logging::events;
use crate::shutdown::Shutdown;

/// The first wait before a task that panicked starts again; it doubles up to [`RESTART_MAX`].
const RESTART_AFTER: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(60);
/// A task that ran this long before it panicked starts again after [`RESTART_AFTER`].
const STEADY: Duration = Duration::from_secs(300);

/// Runs the task that `start` makes, named `task` in the log, and makes it again after each panic until
/// it returns, or until it panics once `shutdown` was requested (see the module's documentation). The
/// handle ends when the task has ended for good.
pub(super) fn spawn<F, T>(task: &'static str, shutdown: Shutdown, mut start: F) -> JoinHandle<()>
where
    F: FnMut() -> T + Send + 'static,
    T: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut backoff = RESTART_AFTER;
        let mut restarts: u64 = 0;
        loop {
            let started = Instant::now();
            let Err(ended) = tokio::spawn(start()).await else {
                return;
            };
            // Cancelled: the runtime is going away, and the task with it.
            let Some(panic) = panic_message(ended) else {
                return;
            };
            if shutdown.is_requested() {
                error!(event = events::worker::TASK_PANICKED, task, error = %panic, restart = false,
                       "A background task of the worker panicked while the worker stops; it is not started again");
                return;
            }
            if started.elapsed() >= STEADY {
                backoff = RESTART_AFTER;
            }
            restarts += 1;
            error!(event = events::worker::TASK_PANICKED, task, error = %panic, restart = true, restarts,
                   restart_in_ms = backoff.as_millis() as u64,
                   "A background task of the worker panicked (a bug: please report it); starting it again");
            // A shutdown meanwhile starts the task at once: it stops (or drains) as it does at a shutdown.
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shutdown.graceful() => {}
            }
            backoff = (backoff * 2).min(RESTART_MAX);
        }
    })
}

/// Logs `ended` as an ERROR if the short-lived task `task` (not restarted) panicked.
pub(super) fn log_panic(task: &'static str, ended: Result<(), JoinError>) {
    if let Some(panic) = ended.err().and_then(panic_message) {
        error!(event = events::worker::TASK_PANICKED, task, error = %panic, restart = false,
               "A task of the worker panicked (a bug: please report it); what it was doing is given up");
    }
}

/// The message of a task that panicked; `None` for one that was cancelled.
fn panic_message(ended: JoinError) -> Option<String> {
    let payload = ended.try_into_panic().ok()?;
    let message = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_string());
    Some(message)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A task that panics on its first two starts is started again after the backoff (1 s, then 2 s)
    /// and runs to its end on the third; once the worker stops, a task that panics is not started again.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_started_again_after_a_backoff_until_it_returns() {
        let starts = Arc::new(AtomicUsize::new(0));
        let shutdown = Shutdown::new();
        let counted = Arc::clone(&starts);
        let began = Instant::now();
        let handle = spawn("test", shutdown.clone(), move || {
            let start = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if start < 2 {
                    panic!("boom {start}");
                }
            }
        });
        handle.await.expect("the supervisor ends");
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        assert_eq!(began.elapsed().as_secs(), 3, "waited 1 s, then 2 s");

        let starts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&starts);
        shutdown.request();
        let handle = spawn("test", shutdown, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { panic!("while stopping") }
        });
        handle.await.expect("the supervisor ends");
        assert_eq!(starts.load(Ordering::SeqCst), 1, "not started again");
    }

    #[tokio::test]
    async fn the_panic_message_is_kept() {
        let ended = tokio::spawn(async { panic!("with {}", "a message") }).await;
        let message = ended.err().and_then(panic_message);
        assert_eq!(message.as_deref(), Some("with a message"));
        let cancelled = tokio::spawn(std::future::pending::<()>());
        cancelled.abort();
        assert_eq!(cancelled.await.err().and_then(panic_message), None);
    }
}
