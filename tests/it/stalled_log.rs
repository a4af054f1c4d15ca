//! A worker whose stdout's reader stalls (a FIFO nobody reads, as a stopped log shipper leaves it): no
//! task waits for stdout, so ticks go on on time; the lines that did not fit are dropped and counted, and
//! the count is logged once the reader reads again.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt as _;
use std::time::{Duration, Instant};

use crate::support::{Backend, TestDir, Worker};

/// How long the reader stalls, and the fewest of its once-a-second ticks the `mark` job must run
/// meanwhile (margin for a loaded machine; with the log written from the tasks, none ran once the pipe
/// was full).
const STALL: Duration = Duration::from_secs(10);
const FEWEST_MARKS: usize = 6;

#[test]
fn a_stalled_log_reader_never_delays_a_tick() {
    let store = Backend::Embedded.start();
    let dir = TestDir::new();
    let fifo = dir.join("log.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    // The read end first (non-blocking: no writer yet), so that the worker's open of the FIFO returns.
    let mut reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("the FIFO's read end opens");
    // `loud` logs 20,000 output lines a second (about 4 MB), far more than a pipe holds.
    let jobs = concat!(
        "  - name: loud\n    schedule: \"* * * * * *\"\n",
        "    command: \"yes logged-line | head -n 20000\"\n",
        "  - name: mark\n    schedule: \"* * * * * *\"\n",
        "    command: \"date +%s%N >> marks\"\n",
    );
    let config = dir.write_config(&store.config("  id: w0\n", jobs));
    let mut worker = Worker::builder(&config).stdout_to(&fifo).spawn();
    let marks = || {
        dir.read("marks")
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse::<u128>().ok())
            .collect::<Vec<_>>()
    };
    let started = Instant::now();
    while marks().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "mark never ran: {}",
            worker.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let from = nanos_now();
    std::thread::sleep(STALL);
    let until = nanos_now();
    let during = marks()
        .into_iter()
        .filter(|at| (from..until).contains(at))
        .count();
    assert!(
        during >= FEWEST_MARKS,
        "{during} marks in {STALL:?} while nobody read the log: the ticks waited for stdout"
    );

    // Read again: the writer reports what it dropped.
    let (mut log, mut chunk) = (Vec::new(), vec![0; 1 << 16]);
    let reading = Instant::now();
    let report = loop {
        match reader.read(&mut chunk) {
            Ok(0) => panic!("the worker closed its stdout: {}", worker.stderr()),
            Ok(n) => log.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("cannot read the FIFO: {e}"),
        }
        let text = String::from_utf8_lossy(&log);
        let found = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|event| event["event"] == "log.dropped");
        if let Some(event) = found {
            break event;
        }
        // Keep only a tail, as a log shipper would have let the rest go by.
        if log.len() > 1 << 20 {
            let cut = log.len() - (1 << 16);
            log.drain(..cut);
        }
        assert!(
            reading.elapsed() < Duration::from_secs(30),
            "no log.dropped event after the reader read again"
        );
    };
    assert_eq!(report["level"], "WARN", "{report}");
    assert!(report["lines"].as_u64() > Some(0), "{report}");
    worker.signal(libc::SIGTERM);
    // Drained meanwhile, so that the worker's last lines are not stuck in the FIFO.
    let stopping = Instant::now();
    while worker.wait_timeout(Duration::from_millis(50)).is_none() {
        let _ = reader.read(&mut chunk);
        assert!(
            stopping.elapsed() < Duration::from_secs(30),
            "the worker did not stop"
        );
    }
}

/// The wall clock in nanoseconds since the epoch, as `date +%s%N` prints it.
fn nanos_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
