//! The listener (`worker.listen`) under a connection flood: anyone who reaches the port can open
//! connections and send nothing. Each holds one of the worker's descriptors, which its jobs' children
//! need too; the listener caps them and times them out, so that a won run never fails for its sake.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound as _, Utc};

use crate::metrics::{get, scrape, value};
use crate::support::{free_port, TestDir, Worker};

/// The worker's open-file limit: 256 kept for the store and the log, 26 for the listener (25 connections
/// and one to close those past them), room for 39 children.
const OPEN_FILES: u64 = 400;
/// Idle connections opened: more than the worker's whole limit.
const FLOOD: usize = 500;

/// A worker with few descriptors (400) whose listener gets 500 connections that send nothing, and one
/// that sends its headers a byte at a time: its job still runs every second, successfully (before the
/// cap, the listener took every descriptor and each won run failed with "Too many open files");
/// connections past the cap are closed at once and counted in `redcron_http_connections_refused_total`;
/// the silent and the slow ones are closed after the header timeout (5 s); then `/metrics` answers.
#[test]
fn a_connection_flood_costs_no_run_and_is_refused_and_timed_out() {
    let dir = TestDir::new();
    let (worker, port) = flooded_worker(&dir);
    let started = worker.events("worker.started").remove(0);
    assert_eq!(
        (
            &started["fd_limit"],
            &started["max_connections"],
            &started["max_children"]
        ),
        (&OPEN_FILES.into(), &25.into(), &39.into()),
        "{started}"
    );

    // One connection that sends its headers slowly, then the silent ones.
    let trickle = std::thread::spawn(move || trickle(port));
    std::thread::sleep(Duration::from_millis(200));
    let flooded_at = Utc::now();
    let mut silent: Vec<TcpStream> = (0..FLOOD)
        .map(|i| {
            let address = ([127, 0, 0, 1], port).into();
            TcpStream::connect_timeout(&address, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("connection {i}: {e}"))
        })
        .collect();

    // The job runs every second from the flood on, and every run succeeds.
    let first = flooded_at.trunc_subsecs(0) + chrono::Duration::seconds(1);
    let ticks: Vec<DateTime<Utc>> = (0..8)
        .map(|s| first + chrono::Duration::seconds(s))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ran: Vec<DateTime<Utc>> = dir
            .ledger_lines()
            .iter()
            .filter_map(|line| DateTime::parse_from_rfc3339(line.trim()).ok())
            .map(|tick| tick.to_utc())
            .collect();
        let missing: Vec<_> = ticks.iter().filter(|tick| !ran.contains(tick)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ticks that did not run during the flood: {missing:?}; runs that failed: {:?}",
            failed_runs(&worker)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        failed_runs(&worker).is_empty(),
        "{:?}",
        failed_runs(&worker)
    );
    let accept_failed = worker.events("worker.listener_accept_failed");
    assert!(
        accept_failed.is_empty(),
        "out of descriptors: {accept_failed:?}"
    );

    // Every silent connection is closed by the worker: those past the cap at once, the others after
    // the header timeout (a connection the worker closed reads end of file).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        silent.retain_mut(|stream| !closed_by_peer(stream));
        if silent.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {FLOOD} silent connections still open 30 s after the flood",
            silent.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let trickled = trickle.join().expect("the slow connection's thread");
    assert!(
        trickled.is_some_and(|took| took < Duration::from_secs(15)),
        "a connection sending its headers a byte every 300 ms was served for {trickled:?}"
    );

    // Then /metrics answers, and counted the connections closed unanswered.
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(port, "/healthz").map(|(status, ..)| status).ok() != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the listener does not answer after the flood"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let refused = value(&scrape(port), "redcron_http_connections_refused_total", &[])
        .expect("redcron_http_connections_refused_total");
    // All but the 25 served at once (and those freed by a timeout while the flood went on, which takes
    // 5 s: connecting 500 takes a fraction of that).
    assert!(
        (400.0..=FLOOD as f64 + 1.0).contains(&refused),
        "refused {refused} of {FLOOD}"
    );
}

/// A worker with [`OPEN_FILES`] descriptors, the embedded store, and a job that writes its tick to the
/// ledger every second, listening; its port.
fn flooded_worker(dir: &TestDir) -> (Worker, u16) {
    for _ in 0..5 {
        let port = free_port();
        let yaml = format!(
            "worker:\n  id: w\n  listen: 127.0.0.1:{port}\njobs:\n  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'echo $REDCRON_TICK >> {}'\n",
            dir.ledger().display()
        );
        let mut worker = Worker::builder(dir.write_config(&yaml))
            .open_files_limit(OPEN_FILES)
            .spawn();
        let first = worker.wait_for(Duration::from_secs(30), |e| {
            e["event"] == "worker.listening" || e["event"] == "worker.failed"
        });
        match first {
            Some(event) if event["event"] == "worker.listening" => {
                worker
                    .wait_for_event("run.finished", Duration::from_secs(30))
                    .expect("the job runs");
                return (worker, port);
            }
            Some(event)
                if event["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("in use")) =>
            {
                worker.wait_timeout(Duration::from_secs(10));
            }
            other => panic!(
                "the worker is not listening: {other:?}\n{}",
                worker.stderr()
            ),
        }
    }
    panic!("no free port in 5 attempts");
}

/// The runs that did not succeed so far.
fn failed_runs(worker: &Worker) -> Vec<serde_json::Value> {
    worker
        .events("run.finished")
        .into_iter()
        .filter(|event| event["outcome"] != "success")
        .collect()
}

/// Whether the other end closed `stream` (it reads end of file, or was reset).
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).expect("nonblocking");
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Sends a request's headers to `port` one byte every 300 ms; how long the connection lasted before the
/// worker closed it (`None`: not within 30 s).
fn trickle(port: u16) -> Option<Duration> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let started = Instant::now();
    let request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    for byte in request {
        if stream.write_all(&[*byte]).is_err() || closed_by_peer(&mut stream) {
            return Some(started.elapsed());
        }
        stream.set_nonblocking(false).expect("blocking");
        if started.elapsed() > Duration::from_secs(30) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    None
}
