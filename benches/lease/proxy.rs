//! A small TCP proxy in front of one Redis node: it can delay every request, and it can count round trips.
//!
//! **Delay.** Each chunk a client sends is forwarded `delay` after it arrived (chunks keep their order and
//! are not held behind one another), so every request to the node is answered `delay` later: a slow node,
//! as a distant or overloaded one would be.
//!
//! **Counting.** The proxy reads the RESP stream in both directions and counts the commands a client sent
//! and its *round trips*: a round trip starts when a command arrives while every earlier command on that
//! connection has been answered, or after the client sent nothing for a millisecond (a node that cannot
//! keep up never drains its backlog, yet each tick's pipeline is still a round trip of its own). A pipeline
//! of 10,000 commands is one round trip; two pipelines sent one after the other's answers are two;
//! requests that overlap on the wire share one. That is what the
//! issue's "round trips per worker per tick" asks for, and what `INFO commandstats` cannot tell (it counts
//! commands, pipelined or not). Commands and round trips are counted per *kind*: the script an `EVALSHA`
//! runs (the caller names the SHA-1s it knows), a round trip by the kind of its first command.
//!
//! Each proxy runs on a thread of its own with a single-threaded runtime, so it does not compete with the
//! code being measured for that code's runtime.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// What a counting proxy saw, over all its connections: per kind (the known scripts, then "other").
#[derive(Debug)]
pub struct Counters {
    /// The SHA-1 of each known script.
    shas: Vec<String>,
    commands: Vec<AtomicU64>,
    round_trips: Vec<AtomicU64>,
}

impl Counters {
    fn new(shas: Vec<String>) -> Counters {
        let kinds = shas.len() + 1;
        Counters {
            shas,
            commands: (0..kinds).map(|_| AtomicU64::new(0)).collect(),
            round_trips: (0..kinds).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The kind of one complete command: the index of its script's SHA-1, or `shas.len()` for any other.
    fn kind(&self, command: &[u8]) -> usize {
        // `*<n>\r\n$7\r\nEVALSHA\r\n$40\r\n<sha>`: the SHA-1 follows the third CRLF after the name.
        let head = &command[..command.len().min(64)];
        let upper: Vec<u8> = head.to_ascii_uppercase();
        let Some(at) = upper.windows(7).position(|w| w == b"EVALSHA") else {
            return self.shas.len();
        };
        let sha = head.get(at + 7 + 2..).and_then(|rest| {
            let line = rest.windows(2).position(|w| w == b"\r\n")?;
            rest.get(line + 2..line + 2 + 40)
        });
        sha.and_then(|sha| self.shas.iter().position(|known| known.as_bytes() == sha))
            .unwrap_or(self.shas.len())
    }
}

/// A proxy listening on a loopback port; stops (and drops its connections) on drop.
pub struct Proxy {
    pub port: u16,
    counters: Option<Arc<Counters>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:<upstream>` that delays requests by `delay` and, if `count` names the
    /// SHA-1s of the scripts to tell apart, counts commands and round trips.
    pub fn start(upstream: u16, delay: Duration, count: Option<Vec<String>>) -> io::Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let counters = count.map(|shas| Arc::new(Counters::new(shas)));
        let (stop, stopped) = oneshot::channel::<()>();
        let shared = counters.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let Ok(runtime) = runtime else { return };
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    let accept = async {
                        while let Ok((client, _)) = listener.accept().await {
                            tokio::spawn(serve(client, upstream, delay, shared.clone()));
                        }
                    };
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept => {}
                    }
                });
                // Dropping the runtime drops every connection task, which closes both of its sockets.
            })?;
        Ok(Proxy {
            port,
            counters,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `(commands, round trips)` so far, per kind (the scripts in the order given, then other).
    pub fn counts(&self) -> Vec<(u64, u64)> {
        let Some(c) = &self.counters else {
            return Vec::new();
        };
        c.commands
            .iter()
            .zip(&c.round_trips)
            .map(|(commands, trips)| {
                (
                    commands.load(Ordering::Relaxed),
                    trips.load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Per-connection bookkeeping for counting: commands sent and replies seen on this connection.
#[derive(Default)]
struct Outstanding {
    sent: AtomicU64,
    answered: AtomicU64,
    /// When request bytes last arrived, and whether the next command starts a round trip for having
    /// followed a silence.
    last_request: std::sync::Mutex<Option<Instant>>,
    after_silence: std::sync::atomic::AtomicBool,
}

/// How one direction of a connection is counted.
#[derive(Clone)]
struct Count {
    counters: Arc<Counters>,
    outstanding: Arc<Outstanding>,
    requests: bool,
}

async fn serve(client: TcpStream, upstream: u16, delay: Duration, counters: Option<Arc<Counters>>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let outstanding = Arc::new(Outstanding::default());
    let requests = counters.clone().map(|counters| Count {
        counters,
        outstanding: Arc::clone(&outstanding),
        requests: true,
    });
    let replies = counters.map(|counters| Count {
        counters,
        outstanding,
        requests: false,
    });
    tokio::select! {
        _ = pump(client_read, server_write, delay, requests) => {}
        _ = pump(server_read, client_write, Duration::ZERO, replies) => {}
    }
}

/// Copies one direction, counting complete RESP values if asked.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    count: Option<Count>,
) {
    let mut parser = Resp::default();
    let mut buf = vec![0u8; 256 * 1024];
    if delay.is_zero() {
        // Written at once: a timer, even an expired one, would wait for the next millisecond tick.
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            tally(&mut parser, count.as_ref(), &buf[..n]);
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    // A writer task sends each chunk when its time comes, so chunks do not queue behind one another's
    // delays.
    let (delayed, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async {
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            tally(&mut parser, count.as_ref(), &buf[..n]);
            if delayed
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
    }
}

/// Counts the values that `bytes` complete: commands and round trips for requests, answers for replies.
fn tally(parser: &mut Resp, count: Option<&Count>, bytes: &[u8]) {
    let Some(Count {
        counters,
        outstanding,
        requests,
    }) = count
    else {
        return;
    };
    if *requests {
        let now = Instant::now();
        let mut last = outstanding
            .last_request
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| now.duration_since(at) > SILENCE) {
            outstanding.after_silence.store(true, Ordering::Relaxed);
        }
        *last = Some(now);
    }
    parser.feed(bytes, |command| {
        if !*requests {
            outstanding.answered.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let kind = counters.kind(command);
        let sent = outstanding.sent.fetch_add(1, Ordering::Relaxed);
        let after_silence = outstanding.after_silence.swap(false, Ordering::Relaxed);
        if after_silence || sent == outstanding.answered.load(Ordering::Relaxed) {
            counters.round_trips[kind].fetch_add(1, Ordering::Relaxed);
        }
        counters.commands[kind].fetch_add(1, Ordering::Relaxed);
    });
}

/// How long a client must have sent nothing for its next command to start a round trip, answered or not.
const SILENCE: Duration = Duration::from_millis(1);

/// An incremental RESP2/RESP3 framer.
#[derive(Default)]
pub struct Resp {
    pending: Vec<u8>,
}

impl Resp {
    /// Appends `bytes` and calls `each` with every top-level value they complete; returns how many.
    pub fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(&[u8])) -> usize {
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        let mut values = 0;
        while let Some(end) = value_end(&self.pending, start) {
            each(&self.pending[start..end]);
            start = end;
            values += 1;
        }
        self.pending.drain(..start);
        values
    }
}

/// The end (exclusive) of the RESP value starting at `pos`, or `None` if it is not complete yet.
fn value_end(buf: &[u8], pos: usize) -> Option<usize> {
    let kind = *buf.get(pos)?;
    let line = buf[pos..].windows(2).position(|w| w == b"\r\n")? + pos;
    let after = line + 2;
    let number = || {
        std::str::from_utf8(&buf[pos + 1..line])
            .ok()?
            .parse::<i64>()
            .ok()
    };
    match kind {
        b'$' | b'!' | b'=' => {
            let len = number()?;
            if len < 0 {
                return Some(after);
            }
            let end = after + len as usize + 2;
            (end <= buf.len()).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let len = number()?;
            let items = if matches!(kind, b'%' | b'|') {
                len * 2
            } else {
                len
            };
            let mut at = after;
            for _ in 0..items.max(0) {
                at = value_end(buf, at)?;
            }
            Some(at)
        }
        // Simple strings, errors, integers, nulls, doubles, booleans, big numbers; or an inline command.
        _ => Some(after),
    }
}

/// The request counter's classification of one command, for the smoke test.
pub fn classify(shas: &[&str], command: &[u8]) -> usize {
    Counters::new(shas.iter().map(|s| s.to_string()).collect()).kind(command)
}
