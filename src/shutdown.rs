//! The two-stage shutdown signal.
//!
//! The first request (SIGINT or SIGTERM, routed here by [`crate::control`]) asks the worker to stop racing for ticks and to let running jobs
//! finish within their grace; the second asks it to stop the jobs now. Every long wait in the worker sits
//! in a `select!` with one of these two futures, so nothing polls a flag.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// A cloneable handle on the worker's shutdown state.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    graceful: CancellationToken,
    immediate: CancellationToken,
    requests: Arc<AtomicUsize>,
}

impl Shutdown {
    /// A shutdown that nobody has requested yet.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Records one shutdown request: the first is graceful, the second (and later) immediate.
    ///
    /// Safe to call from any thread, including a signal-handling thread.
    pub fn request(&self) {
        let previous = self.requests.fetch_add(1, Ordering::SeqCst);
        self.graceful.cancel();
        if previous >= 1 {
            self.immediate.cancel();
        }
    }

    /// Asks for an immediate stop at once (as a second signal would).
    pub fn request_immediate(&self) {
        self.requests.fetch_add(2, Ordering::SeqCst);
        self.graceful.cancel();
        self.immediate.cancel();
    }

    /// Completes once a graceful (or immediate) shutdown has been requested.
    pub async fn graceful(&self) {
        self.graceful.cancelled().await
    }

    /// Completes once an immediate shutdown has been requested.
    pub async fn immediate(&self) {
        self.immediate.cancelled().await
    }

    /// Whether any shutdown has been requested.
    pub fn is_requested(&self) -> bool {
        self.graceful.is_cancelled()
    }

    /// Whether an immediate shutdown has been requested.
    pub fn is_immediate(&self) -> bool {
        self.immediate.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_request_is_graceful_second_immediate() {
        let shutdown = Shutdown::new();
        assert!(!shutdown.is_requested());
        shutdown.request();
        shutdown.graceful().await;
        assert!(shutdown.is_requested());
        assert!(!shutdown.is_immediate());
        shutdown.clone().request();
        shutdown.immediate().await;
        assert!(shutdown.is_immediate());
    }
}
