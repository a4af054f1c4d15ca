//! The history writer: entries go to the store in the background, in batches, never on a claim's path.
//!
//! The race and the runs hand their entries to [`Recorder::note`], which never waits: the entry goes
//! into a bounded queue, and one task writes what has queued up in one call to
//! [`crate::store::Store::record`] (one pipeline per node, however many entries), [`GATHER`] after the
//! first entry of a batch arrived. A job's start therefore never waits for history, and a slow or
//! failed write costs history, never a run. A write that a majority did not take is kept and tried
//! again (1 s, doubling up to 30 s) until it is taken; only beyond 10,000 waiting entries or
//! [`HELD_BYTES`] of them (a job's output tails make an entry up to 128 KiB), or at shutdown, are
//! entries dropped, and that is logged. One call carries at most [`BATCH`] entries and [`CALL_BYTES`]
//! (or one entry): what every store takes in one request. At shutdown the queue is written out before
//! the worker exits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tracing::warn;

use super::Context;
use crate::history::Entry;
use crate::logging::events;

/// How many entries may wait for the writer; beyond it new entries are dropped (and counted).
const QUEUE: usize = 10_000;
/// The most entries written in one call.
const BATCH: usize = 1_000;
/// The most bytes ([`Entry::held_bytes`]) of entries written in one call, unless one entry alone is
/// more: below what each store takes in one request (etcd's 1.5 MiB, ZooKeeper's 1 MiB a node).
const CALL_BYTES: usize = 1024 * 1024;
/// The most bytes of entries queued and waiting for the writer together; beyond it new entries are
/// dropped (and counted): 10,000 entries with full output tails would hold 1.3 GB.
const HELD_BYTES: usize = 64 * 1024 * 1024;
/// How long the writer lets entries gather after the first one arrives before it writes. The entries of a
/// tick's runs then go to the nodes after the tick's other jobs have started, not among their claims, and
/// a run that ends within it has its start and its end written once, as its end.
const GATHER: Duration = Duration::from_millis(20);
/// The first wait before a write that a majority did not take is tried again; it doubles up to
/// [`RETRY_MAX`].
const RETRY_AFTER: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The worker's handle on the history writer.
pub(crate) struct Recorder {
    queue: mpsc::Sender<Entry>,
    /// The writer's end of the queue, held by the writer while it runs: one that panicked leaves it to
    /// the next ([`super::background`]), with the entries still queued.
    pending: tokio::sync::Mutex<mpsc::Receiver<Entry>>,
    dropped: AtomicU64,
    /// The bytes of the entries queued or waiting in the writer ([`Entry::held_bytes`]).
    held: AtomicUsize,
    closing: Notify,
}

impl Recorder {
    pub(crate) fn new() -> Recorder {
        let (queue, pending) = mpsc::channel(QUEUE);
        Recorder {
            queue,
            pending: tokio::sync::Mutex::new(pending),
            dropped: AtomicU64::new(0),
            held: AtomicUsize::new(0),
            closing: Notify::new(),
        }
    }

    /// Queues `entry` for the store; never waits. A full queue, by entries or by [`HELD_BYTES`], drops
    /// it (counted, logged by the writer).
    pub(crate) fn note(&self, entry: Entry) {
        let size = entry.held_bytes();
        let held = self.held.fetch_add(size, Ordering::Relaxed);
        if held + size > HELD_BYTES || self.queue.try_send(entry).is_err() {
            self.held.fetch_sub(size, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts `entries` as no longer held: written or dropped.
    fn release<'a>(&self, entries: impl IntoIterator<Item = &'a Entry>) {
        let size: usize = entries.into_iter().map(Entry::held_bytes).sum();
        self.held.fetch_sub(size, Ordering::Relaxed);
    }

    /// Asks the writer to write what is queued and stop.
    pub(crate) fn close(&self) {
        self.closing.notify_one();
    }
}

/// Starts the writer of `context.recorder`, supervised ([`super::background`]); it returns after
/// [`Recorder::close`], once the queue is written (or, with no majority, tried once more).
pub(crate) fn start(context: Arc<Context>) -> tokio::task::JoinHandle<()> {
    let shutdown = context.shutdown.clone();
    super::background::spawn("recorder", shutdown, move || writer(Arc::clone(&context)))
}

/// The writer: one at a time, holding the queue's receiving end.
async fn writer(context: Arc<Context>) {
    let mut queue = context.recorder.pending.lock().await;
    // Entries a majority has not taken yet: kept (up to `QUEUE`) and tried again with a growing
    // pause, so that a run that ended during an outage of the nodes is still in the history after it.
    let mut unwritten: Vec<Entry> = Vec::new();
    let mut backoff = RETRY_AFTER;
    loop {
        let mut batch = Vec::new();
        let retry = tokio::time::sleep(backoff);
        tokio::select! {
            received = queue.recv_many(&mut batch, BATCH) => {
                if received == 0 {
                    return;
                }
            }
            () = retry, if !unwritten.is_empty() => {}
            () = context.recorder.closing.notified() => {
                while let Ok(entry) = queue.try_recv() {
                    batch.push(entry);
                }
                unwritten.extend(batch);
                if !write(&context, &mut unwritten).await {
                    give_up(&context, &unwritten);
                }
                return;
            }
        }
        // A close meanwhile is not missed: `Notify` keeps its permit for the next turn of the loop.
        tokio::time::sleep(GATHER).await;
        while batch.len() < BATCH {
            let Ok(entry) = queue.try_recv() else { break };
            batch.push(entry);
        }
        unwritten.extend(batch);
        if write(&context, &mut unwritten).await {
            backoff = RETRY_AFTER;
        } else {
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }
}

/// Writes `unwritten` in batches; `true` once all are written (then `unwritten` is empty). Beyond
/// [`QUEUE`] entries the oldest are dropped and counted.
async fn write(context: &Context, unwritten: &mut Vec<Entry>) -> bool {
    let recorder = &context.recorder;
    let excess = unwritten.len().saturating_sub(QUEUE);
    if excess > 0 {
        recorder.release(unwritten.drain(..excess).as_slice());
        context
            .recorder
            .dropped
            .fetch_add(excess as u64, Ordering::Relaxed);
    }
    let before: usize = unwritten.iter().map(Entry::held_bytes).sum();
    keep_latest(unwritten);
    let after: usize = unwritten.iter().map(Entry::held_bytes).sum();
    recorder.held.fetch_sub(before - after, Ordering::Relaxed);
    let dropped = context.recorder.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        warn!(
            event = events::history::DROPPED,
            entries = dropped,
            "History entries dropped: the writer fell too far behind (the nodes were unreachable for long)"
        );
    }
    while !unwritten.is_empty() {
        let take = call_length(unwritten);
        match context.store.record(&unwritten[..take]).await {
            Ok(()) => {
                recorder.release(unwritten.drain(..take).as_slice());
            }
            Err(failure) => {
                context.metrics.history_write_failed();
                warn!(event = events::history::WRITE_FAILED, entries = unwritten.len() as u64, error = %failure,
                      "History entries not written to a majority of nodes yet; trying again");
                return false;
            }
        }
    }
    true
}

/// How many of `entries`, from the first, one call writes: at most [`BATCH`], and at most
/// [`CALL_BYTES`] unless the first alone is more.
fn call_length(entries: &[Entry]) -> usize {
    let mut bytes = 0;
    let fitting = entries
        .iter()
        .take(BATCH)
        .take_while(|entry| {
            bytes += entry.held_bytes();
            bytes <= CALL_BYTES
        })
        .count();
    fitting.max(1).min(entries.len())
}

/// Drops every entry that a later one in `entries` replaces (same job and [`Entry::id`]: a run's entry
/// written at its start and again when it ended), keeping the order of the rest. Every store keeps one
/// entry per job and id, the last written, so writing only that one leaves the same history — and a
/// short run whose start and end wait in one batch costs one write instead of two.
fn keep_latest(entries: &mut Vec<Entry>) {
    let mut seen = std::collections::HashSet::new();
    let mut keep: Vec<bool> = entries
        .iter()
        .rev()
        .map(|entry| seen.insert((entry.job.clone(), entry.id())))
        .collect();
    keep.reverse();
    let mut index = 0;
    entries.retain(|_| {
        index += 1;
        keep[index - 1]
    });
}

/// Logs the entries a stopping worker could not write.
fn give_up(context: &Context, unwritten: &[Entry]) {
    context.recorder.release(unwritten);
    context
        .recorder
        .dropped
        .fetch_add(unwritten.len() as u64, Ordering::Relaxed);
    warn!(
        event = events::history::DROPPED,
        entries = unwritten.len() as u64,
        "History entries dropped at shutdown: no majority of nodes took them"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Kind;
    use crate::schedule::Tick;

    #[test]
    fn a_run_entry_written_again_replaces_the_earlier_one_in_the_batch() {
        let now = chrono::Utc::now();
        let started = Entry::new("a", Tick(1_000), "w0", Kind::Run, now);
        let mut ended = started.clone();
        ended.outcome = Some("success".to_string());
        let other_job = Entry::new("b", Tick(1_000), "w0", Kind::Run, now);
        let lost = Entry::new("a", Tick(1_000), "w1", Kind::Lost, now);
        let mut entries = vec![started, other_job.clone(), lost.clone(), ended.clone()];
        keep_latest(&mut entries);
        let kept: Vec<(String, String, Option<String>)> = entries
            .iter()
            .map(|e| (e.job.clone(), e.id(), e.outcome.clone()))
            .collect();
        let expected: Vec<(String, String, Option<String>)> = [other_job, lost, ended]
            .iter()
            .map(|e| (e.job.clone(), e.id(), e.outcome.clone()))
            .collect();
        assert_eq!(kept, expected);
    }

    fn with_tails(bytes: usize) -> Entry {
        let mut entry = Entry::new("a", Tick(1_000), "w0", Kind::Run, chrono::Utc::now());
        entry.tail_out = Some("x".repeat(bytes));
        entry
    }

    #[test]
    fn a_call_is_bounded_by_bytes_but_carries_at_least_one_entry() {
        let small: Vec<Entry> = (0..5).map(|_| with_tails(100)).collect();
        assert_eq!(call_length(&small), 5);
        let large: Vec<Entry> = (0..20).map(|_| with_tails(128 * 1024)).collect();
        assert_eq!(
            call_length(&large),
            7,
            "7 × 128.5 KiB fit in 1 MiB, 8 do not"
        );
        let huge = vec![with_tails(2 * CALL_BYTES), with_tails(10)];
        assert_eq!(call_length(&huge), 1);
        assert_eq!(call_length(&[]), 0);
        let many: Vec<Entry> = (0..BATCH + 5).map(|_| with_tails(0)).collect();
        assert_eq!(call_length(&many), BATCH);
    }

    #[test]
    fn entries_beyond_the_held_bytes_are_dropped_and_counted() {
        let recorder = Recorder::new();
        let entry = with_tails(128 * 1024);
        let fit = HELD_BYTES / entry.held_bytes();
        for _ in 0..fit + 3 {
            recorder.note(entry.clone());
        }
        assert_eq!(recorder.dropped.load(Ordering::Relaxed), 3);
        assert!(recorder.held.load(Ordering::Relaxed) <= HELD_BYTES);
        recorder.release(std::iter::repeat_n(&entry, fit));
        assert_eq!(recorder.held.load(Ordering::Relaxed), 0);
    }
}
