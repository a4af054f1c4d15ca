//! The log's way to stdout: a bounded queue that a thread of its own writes out, so that no task ever
//! waits for stdout.
//!
//! A worker's stdout is a pipe to journald, a container runtime or a shell; a reader that stalls (stopped,
//! swapped out, a full disk behind it) fills the pipe, and a `write` to it then blocks. Written from the
//! tasks that log, that froze the tick loop for as long as the reader stalled (22 s in a review, with a
//! FIFO whose reader was stopped). Here an event's line goes into a queue of at most [`QUEUE_BYTES`]
//! and never waits: a line that does not fit is dropped and counted ([`dropped_lines`], the metric
//! `redcron_log_lines_dropped_total`), and once lines flow again the count is logged (`log.dropped`).
//! At exit, [`Flush`] writes out what is queued, waiting at most [`FLUSH_LIMIT`] for a reader.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// The most bytes of lines waiting for stdout; beyond it a new line is dropped.
pub(crate) const QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// The longest [`Flush`] waits for the queue to be written out at exit.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// Lines dropped since the process started (the queue was full), for the metric.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// The log lines dropped so far because stdout did not take them in time.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Renders the line that says how many lines were dropped, in the log's format.
pub(crate) type Report = Box<dyn Fn(u64) -> Vec<u8> + Send>;

/// The queue between the tasks that log and the thread that writes.
struct Queue {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Whether the writer thread is in a `write` (its line already taken off the queue).
    writing: bool,
    /// Lines dropped since the writer last reported them.
    unreported: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a line is queued (for the writer) and when the queue is empty (for [`Flush`]).
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the queue leaves it whole: every use is a push or a pop.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The non-blocking writer of the log: a [`MakeWriter`] whose writers queue each line.
#[derive(Clone)]
pub(crate) struct Sink {
    shared: Arc<Shared>,
}

/// The one sink of the process, once [`Sink::stdout`] started it.
static STDOUT: OnceLock<Sink> = OnceLock::new();

impl Sink {
    /// The sink writing to stdout, its thread started on first use. `report` renders the line that
    /// says how many lines were dropped, in the log's format.
    pub(crate) fn stdout(report: Report) -> Sink {
        STDOUT
            .get_or_init(|| Sink::start(io::stdout(), report))
            .clone()
    }

    /// A sink writing to `out` from a thread of its own.
    fn start<W: Write + Send + 'static>(out: W, report: Report) -> Sink {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                lines: VecDeque::new(),
                bytes: 0,
                writing: false,
                unreported: 0,
            }),
            changed: Condvar::new(),
        });
        let writer = Arc::clone(&shared);
        let started = std::thread::Builder::new()
            .name("redcron-log".to_string())
            .spawn(move || write_out(&writer, out, report));
        if started.is_err() {
            // No thread: every line is dropped and counted, none blocks.
            shared.lock().bytes = usize::MAX;
        }
        Sink { shared }
    }

    /// Queues `line`, or drops and counts it when the queue is full; never waits for stdout.
    fn push(&self, line: Vec<u8>) {
        let mut queue = self.shared.lock();
        if queue.bytes.saturating_add(line.len()) > QUEUE_BYTES && !line.is_empty() {
            queue.unreported += 1;
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        queue.bytes += line.len();
        queue.lines.push_back(line);
        drop(queue);
        self.shared.changed.notify_all();
    }

    /// Waits until every queued line is written, for at most `limit`; whether they all were.
    fn drain(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut queue = self.shared.lock();
        while !queue.lines.is_empty() || queue.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            queue = self
                .shared
                .changed
                .wait_timeout(queue, left)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
        }
        true
    }
}

/// The writer thread: takes lines off the queue and writes them, one `write_all` each; after lines
/// were dropped, writes the report of how many first.
fn write_out<W: Write>(shared: &Shared, mut out: W, report: Report) {
    loop {
        let mut queue = shared.lock();
        queue.writing = false;
        shared.changed.notify_all();
        while queue.lines.is_empty() {
            queue = shared
                .changed
                .wait(queue)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let dropped = std::mem::take(&mut queue.unreported);
        let line = queue.lines.pop_front().unwrap_or_default();
        queue.bytes -= line.len();
        queue.writing = true;
        drop(queue);
        if dropped > 0 {
            let _ = out.write_all(&report(dropped));
        }
        // A failed write (stdout closed) loses the line; there is nowhere else to say so.
        let _ = out.write_all(&line);
        let _ = out.flush();
    }
}

/// One event's line, queued when the writer is dropped (the formatter writes a line at a time).
pub(crate) struct LineWriter {
    sink: Sink,
    line: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.sink.push(std::mem::take(&mut self.line));
        }
    }
}

impl<'w> MakeWriter<'w> for Sink {
    type Writer = LineWriter;
    fn make_writer(&'w self) -> LineWriter {
        LineWriter {
            sink: self.clone(),
            line: Vec::new(),
        }
    }
}

/// Writes out the log's queue when dropped (at exit), waiting at most [`FLUSH_LIMIT`] for stdout.
#[derive(Debug)]
#[must_use = "the log's last lines are written when this is dropped"]
pub struct Flush(());

impl Flush {
    pub(crate) fn new() -> Flush {
        Flush(())
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        if let Some(sink) = STDOUT.get() {
            sink.drain(FLUSH_LIMIT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that blocks every write until the test lets it go, recording what it wrote.
    #[derive(Clone)]
    struct Stalled {
        open: Arc<(Mutex<bool>, Condvar)>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Stalled {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (open, opened) = &*self.open;
            let mut is_open = open.lock().expect("no panic in the test");
            while !*is_open {
                is_open = opened.wait(is_open).expect("no panic in the test");
            }
            self.written
                .lock()
                .expect("no panic in the test")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn report(lines: u64) -> Vec<u8> {
        format!("dropped {lines}\n").into_bytes()
    }

    #[test]
    fn a_stalled_reader_never_blocks_a_line_and_the_drops_are_counted_then_reported() {
        let stalled = Stalled {
            open: Arc::new((Mutex::new(false), Condvar::new())),
            written: Arc::default(),
        };
        let sink = Sink::start(stalled.clone(), Box::new(report));
        let line = vec![b'x'; 1023];
        let started = Instant::now();
        let lines = 2 * QUEUE_BYTES / 1024;
        for _ in 0..lines {
            let mut writer = sink.make_writer();
            writer.write_all(&line).expect("queued");
            writer.write_all(b"\n").expect("queued");
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "queued without waiting"
        );
        let dropped = sink.shared.lock().unreported;
        // The queue holds QUEUE_BYTES of lines, and the writer one more (its blocked write).
        assert_eq!(dropped, (lines - QUEUE_BYTES / 1024 - 1) as u64);
        assert!(sink.shared.lock().bytes <= QUEUE_BYTES);
        *stalled.open.0.lock().expect("no panic") = true;
        stalled.open.1.notify_all();
        assert!(sink.drain(Duration::from_secs(10)), "written out");
        sink.make_writer().write_all(b"after\n").expect("queued");
        assert!(sink.drain(Duration::from_secs(10)), "written out");
        let written = stalled.written.lock().expect("no panic").clone();
        let text = String::from_utf8_lossy(&written);
        assert!(text.contains(&format!("dropped {dropped}\n")), "reported");
        assert!(text.ends_with("after\n"));
        let kept = text.lines().filter(|l| l.starts_with('x')).count() as u64;
        assert_eq!(
            kept + dropped,
            lines as u64,
            "every line written or counted"
        );
    }
}
