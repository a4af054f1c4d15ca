//! The history writer: entries go to the store in the background, in batches, never on a claim's path.
//!
//! The race and the runs hand their entries to [`Recorder::note`], which never waits: the entry goes into a
//! bounded queue, and one task writes what has queued up in one call to [`crate::store::Store::record`]
//! (one pipeline per node, however many entries). A job's start therefore never waits for history, and a
//! slow or failed write costs history, never a run. A write that a majority did not take is tried once
//! more; what is lost is logged. At shutdown the queue is written out before the worker exits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tracing::warn;

use super::Context;
use crate::history::Entry;

/// How many entries may wait for the writer; beyond it new entries are dropped (and counted).
const QUEUE: usize = 10_000;
/// The most entries written in one call.
const BATCH: usize = 1_000;
/// The wait before a write that a majority did not take is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The worker's handle on the history writer.
pub(crate) struct Recorder {
    queue: mpsc::Sender<Entry>,
    /// Taken by [`start`]: the writer's end of the queue.
    pending: std::sync::Mutex<Option<mpsc::Receiver<Entry>>>,
    dropped: AtomicU64,
    closing: Notify,
}

impl Recorder {
    pub(crate) fn new() -> Recorder {
        let (queue, pending) = mpsc::channel(QUEUE);
        Recorder {
            queue,
            pending: std::sync::Mutex::new(Some(pending)),
            dropped: AtomicU64::new(0),
            closing: Notify::new(),
        }
    }

    /// Queues `entry` for the store; never waits. A full queue drops it (counted, logged by the writer).
    pub(crate) fn note(&self, entry: Entry) {
        if self.queue.try_send(entry).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the writer to write what is queued and stop.
    pub(crate) fn close(&self) {
        self.closing.notify_one();
    }
}

/// Starts the writer of `context.recorder`; it returns after [`Recorder::close`], once the queue is written.
pub(crate) fn start(context: Arc<Context>) -> Option<tokio::task::JoinHandle<()>> {
    let mut queue = context
        .recorder
        .pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()?;
    Some(tokio::spawn(async move {
        loop {
            let mut batch = Vec::new();
            tokio::select! {
                received = queue.recv_many(&mut batch, BATCH) => {
                    if received == 0 {
                        return;
                    }
                    write(&context, batch).await;
                }
                () = context.recorder.closing.notified() => {
                    while let Ok(entry) = queue.try_recv() {
                        batch.push(entry);
                    }
                    write(&context, batch).await;
                    return;
                }
            }
        }
    }))
}

/// Writes one batch, once more after [`RETRY_AFTER`] if a majority did not take it.
async fn write(context: &Context, batch: Vec<Entry>) {
    let dropped = context.recorder.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        warn!(
            event = "history.dropped",
            entries = dropped,
            "History entries dropped: the writer could not keep up with the queue"
        );
    }
    if batch.is_empty() {
        return;
    }
    let Err(first) = context.store.record(&batch).await else {
        return;
    };
    tokio::time::sleep(RETRY_AFTER).await;
    if let Err(failure) = context.store.record(&batch).await {
        context.metrics.history_write_failed();
        warn!(event = "history.write_failed", entries = batch.len() as u64, error = %failure,
              first_error = %first,
              "History entries not written to a majority of nodes: they may be missing from `redcron history`");
    }
}
