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

/// The token of the dashboard of [`dashboard_worker`].
const TOKEN: &str = "listener-token-0123456789";

/// A worker like [`flooded_worker`]'s, with 1,024 descriptors (64 connections) and a dashboard with a
/// token; its port.
fn dashboard_worker(dir: &TestDir) -> (Worker, u16) {
    for _ in 0..5 {
        let port = free_port();
        let yaml = format!(
            "worker:\n  id: w\n  listen: 127.0.0.1:{port}\ndashboard:\n  token: {TOKEN}\n\
             jobs:\n  - name: quiet\n    schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n"
        );
        let mut worker = Worker::builder(dir.write_config(&yaml))
            .open_files_limit(1024)
            .spawn();
        let first = worker.wait_for(Duration::from_secs(30), |e| {
            e["event"] == "worker.listening" || e["event"] == "worker.failed"
        });
        match first {
            Some(event) if event["event"] == "worker.listening" => return (worker, port),
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

/// Sends `request` (the whole of it) on a new connection to `port` and reads the answer until the
/// worker closes the connection or `within` passes: the answer's text, or why there is none.
pub(crate) fn raw(port: u16, request: &str, within: Duration) -> Result<String, String> {
    let address = ([127, 0, 0, 1], port).into();
    let mut stream =
        TcpStream::connect_timeout(&address, within).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(within))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) if answer.is_empty() => Err("closed without an answer".to_string()),
        Ok(_) => Ok(String::from_utf8_lossy(&answer).into_owned()),
        Err(e) if !answer.is_empty() => {
            Err(format!("{e} after {:?}", String::from_utf8_lossy(&answer)))
        }
        Err(e) => Err(format!("read: {e}")),
    }
}

/// The status of a raw answer (0 if it has none).
pub(crate) fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// Probes `/healthz` of `port` every 100 ms until `stop`, from the address `127.0.0.2` (a prober is
/// another client than the one flooding: a kubelet probes from its node): how long each probe took, or
/// why it failed (anything but 200 within [`PROBE_WITHIN`]).
fn probe_until(port: u16, stop: &std::sync::atomic::AtomicBool) -> Vec<Result<Duration, String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut probes = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let started = Instant::now();
        let answer = runtime
            .block_on(async { tokio::time::timeout(PROBE_WITHIN, healthz_from(port)).await });
        let probe = match answer {
            Ok(Ok(answer)) if status_of(&answer) == 200 => Ok(started.elapsed()),
            Ok(Ok(answer)) => Err(format!(
                "after {:?}: {:?}",
                started.elapsed(),
                answer.lines().next()
            )),
            Ok(Err(why)) => Err(format!("after {:?}: {why}", started.elapsed())),
            Err(_) => Err(format!("no answer within {PROBE_WITHIN:?}")),
        };
        probes.push(probe);
        std::thread::sleep(Duration::from_millis(100));
    }
    probes
}

/// `GET /healthz` of `port` from `127.0.0.2`: the answer's text.
async fn healthz_from(port: u16) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(([127, 0, 0, 2], 0).into())?;
    let mut stream = socket.connect(([127, 0, 0, 1], port).into()).await?;
    let request = "GET /healthz HTTP/1.1\r\nHost: 10.1.2.3:9464\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// How long a liveness probe waits (kubelet's default is 1 s; this machine is loaded).
const PROBE_WITHIN: Duration = Duration::from_millis(1500);

/// The attacks of issue 46.6 on a dashboard with a token from one address, each while `/healthz` is
/// probed every 100 ms from another: 300 connections that send a `POST /login`'s headers and never its body
/// (before: each held its connection until the 30 s request timeout, and every probe found the
/// listener full), then 32 clients reconnecting for 6 s with wrong bearer tokens (before: each
/// waited its turn behind the one-at-a-time failure delay, holding its connection). Every probe
/// answers 200 within 1.5 s; the unfinished bodies are answered 408 within the 5 s body timeout; of
/// the wrong tokens one a second is checked (401), the others are 429 unchecked or 503.
#[test]
fn health_answers_under_slow_bodies_and_a_wrong_token_flood() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let dir = TestDir::new();
    let (_worker, port) = dashboard_worker(&dir);
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || probe_until(port, &stop))
    };
    let head = format!(
        "POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 100\r\n\r\ntoken="
    );
    let slow: Vec<TcpStream> = (0..300)
        .filter_map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            stream.write_all(head.as_bytes()).ok()?;
            Some(stream)
        })
        .collect();
    // The slow bodies are held for the body timeout (5 s): probe through it and a little after.
    std::thread::sleep(Duration::from_secs(7));
    stop.store(true, Ordering::Relaxed);
    let during_slow = prober.join().expect("the prober");
    let answered: Vec<String> = slow
        .into_iter()
        .filter_map(|mut stream| {
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            let mut text = Vec::new();
            let _ = stream.read_to_end(&mut text);
            let text = String::from_utf8_lossy(&text).into_owned();
            (!text.is_empty()).then_some(text)
        })
        .collect();
    assert!(
        answered.iter().any(|a| status_of(a) == 408),
        "no slow body answered 408: {:?}",
        answered
            .iter()
            .map(|a| a.lines().next())
            .collect::<Vec<_>>()
    );

    // The wrong-token flood.
    stop.store(false, Ordering::Relaxed);
    let prober = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || probe_until(port, &stop))
    };
    let until = Instant::now() + Duration::from_secs(6);
    let flood: Vec<_> = (0..32)
        .map(|i| {
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while Instant::now() < until {
                    let request = format!(
                        "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                         Authorization: Bearer wrong-token-{i:04}-0123456789\r\nConnection: close\r\n\r\n"
                    );
                    if let Ok(answer) = raw(port, &request, Duration::from_secs(5)) {
                        statuses.push(status_of(&answer));
                    }
                }
                statuses
            })
        })
        .collect();
    let statuses: Vec<u16> = flood
        .into_iter()
        .flat_map(|f| f.join().expect("a flooder"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let during_flood = prober.join().expect("the prober");
    // 401 checked and wrong, 429 not checked (cooling down), 503 on a reserve connection (one client
    // holds half the general ones).
    let count = |status: u16| statuses.iter().filter(|s| **s == status).count();
    eprintln!(
        "wrong tokens: {} answers: {} 401, {} 429, {} 503",
        statuses.len(),
        count(401),
        count(429),
        count(503)
    );
    assert!(
        statuses.iter().all(|s| matches!(s, 401 | 429 | 503)),
        "a wrong token let in: {:?}",
        statuses
            .iter()
            .filter(|s| !matches!(s, 401 | 429 | 503))
            .collect::<Vec<_>>()
    );
    let failures = statuses.iter().filter(|s| **s == 401).count();
    assert!(
        (1..=8).contains(&failures),
        "one checked failure per second from one address: {failures} in 6 s"
    );
    for (what, probes) in [
        ("slow bodies", &during_slow),
        ("wrong tokens", &during_flood),
    ] {
        let failed: Vec<&String> = probes.iter().filter_map(|p| p.as_ref().err()).collect();
        let slowest = probes.iter().filter_map(|p| p.as_ref().ok()).max();
        eprintln!(
            "{what}: {} probes, slowest {slowest:?}, {} wrong tokens answered",
            probes.len(),
            statuses.len()
        );
        assert!(probes.len() >= 10, "{what}: {} probes", probes.len());
        assert!(
            failed.is_empty(),
            "{what}: {} of {} probes failed: {failed:?}",
            failed.len(),
            probes.len()
        );
    }
}
