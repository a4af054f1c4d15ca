//! [`DelayProxy`]: a TCP proxy in front of one node that holds back chosen requests — a slow round trip
//! for one kind of command only, as one TCP retransmission or one fsync stall makes it.
//!
//! Bytes from the client are scanned for a marker (e.g. the SHA1 of a script, which every `EVALSHA` of it
//! carries); while delays are armed ([`DelayProxy::delay_next`]), a chunk that contains the marker waits
//! before it is forwarded, and everything behind it on that connection waits too, as on a real link.
//! Chosen requests can also be lost instead ([`DelayProxy::lose_answer_next`],
//! [`DelayProxy::lose_request_next`]): the connection that carried one is cut, with the node's answer (or
//! the request itself) never passed on — a reply lost on its way back, or a request that never arrived.
//! Plain threads, so it runs beside any test runtime; everything stops on drop.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct DelayProxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    marker: Vec<u8>,
    delay: Duration,
    armed: AtomicUsize,
    delayed: AtomicUsize,
    /// Marked chunks still to pass on before their connection is cut, its answers dropped.
    losing_answers: AtomicUsize,
    /// Marked chunks still to drop, with their connection.
    losing_requests: AtomicUsize,
    lost: AtomicUsize,
    stopping: AtomicBool,
    streams: Mutex<Vec<TcpStream>>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards to `upstream_port`; chunks containing `marker` wait
    /// `delay` while delays are armed.
    pub fn start(upstream_port: u16, marker: &str, delay: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind the proxy on loopback");
        let port = listener.local_addr().expect("bound address").port();
        let shared = Arc::new(Shared {
            marker: marker.as_bytes().to_vec(),
            delay,
            armed: AtomicUsize::new(0),
            delayed: AtomicUsize::new(0),
            losing_answers: AtomicUsize::new(0),
            losing_requests: AtomicUsize::new(0),
            lost: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            streams: Mutex::new(Vec::new()),
        });
        let accept = Arc::clone(&shared);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accept.stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let pumps = (client.try_clone(), server.try_clone());
                let (Ok(client_reader), Ok(server_reader)) = pumps else {
                    continue;
                };
                if let Ok(mut streams) = accept.streams.lock() {
                    streams.extend(client.try_clone());
                    streams.extend(server.try_clone());
                }
                let up = Arc::clone(&accept);
                let cut = Arc::new(AtomicBool::new(false));
                let link = Link {
                    shared: up,
                    cut: Arc::clone(&cut),
                    client: client.try_clone().ok(),
                };
                std::thread::spawn(move || pump(client_reader, server, Some(&link)));
                std::thread::spawn(move || answer(server_reader, client, &cut));
            }
        });
        DelayProxy { port, shared }
    }

    /// The URL workers and stores use instead of the node's.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port the proxy listens on (for a node that is not Redis: `http://127.0.0.1:<port>` for etcd).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Passes the next `count` chunks that carry the marker on to the node, then — the proxy's delay
    /// later, time for the node to apply them — cuts their connection without passing on anything the
    /// node answered on it since: the request applied, its answer lost.
    pub fn lose_answer_next(&self, count: usize) {
        self.shared.losing_answers.store(count, Ordering::SeqCst);
    }

    /// Drops the next `count` chunks that carry the marker and cuts their connection: the request never
    /// reaches the node.
    pub fn lose_request_next(&self, count: usize) {
        self.shared.losing_requests.store(count, Ordering::SeqCst);
    }

    /// How many marked chunks had their answer or themselves lost so far.
    pub fn lost(&self) -> usize {
        self.shared.lost.load(Ordering::SeqCst)
    }

    /// Holds back the next `count` chunks that carry the marker.
    pub fn delay_next(&self, count: usize) {
        self.shared.armed.store(count, Ordering::SeqCst);
    }

    /// How many chunks were held back so far.
    pub fn delayed(&self) -> usize {
        self.shared.delayed.load(Ordering::SeqCst)
    }
}

/// One proxied connection, as the client-to-node pump sees it.
struct Link {
    shared: Arc<Shared>,
    /// Set once the connection is being cut: the node's answers are no longer passed on.
    cut: Arc<AtomicBool>,
    client: Option<TcpStream>,
}

/// Takes one from `counter` if it is above zero.
fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Copies `from` (the client) to `to` (the node); with `link`, delays or loses marked chunks as armed.
fn pump(mut from: TcpStream, mut to: TcpStream, link: Option<&Link>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(link) = link {
            let shared = &link.shared;
            let marked = buffer[..n]
                .windows(shared.marker.len())
                .any(|window| window == shared.marker.as_slice());
            if marked && take_one(&shared.losing_requests) {
                shared.lost.fetch_add(1, Ordering::SeqCst);
                link.cut.store(true, Ordering::SeqCst);
                break;
            }
            if marked && take_one(&shared.losing_answers) {
                shared.lost.fetch_add(1, Ordering::SeqCst);
                link.cut.store(true, Ordering::SeqCst);
                let _ = to.write_all(&buffer[..n]);
                std::thread::sleep(shared.delay);
                break;
            }
            if marked && take_one(&shared.armed) {
                shared.delayed.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(shared.delay);
            }
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    match link {
        // A cut connection: closed both ways at once, as a broken link or a reset shows it.
        Some(link) if link.cut.load(Ordering::SeqCst) => {
            let _ = to.shutdown(Shutdown::Both);
            if let Some(client) = &link.client {
                let _ = client.shutdown(Shutdown::Both);
            }
        }
        _ => {
            let _ = to.shutdown(Shutdown::Write);
        }
    }
}

/// Copies the node's answers (`from`) to the client (`to`), dropping them once the connection is cut.
fn answer(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop, then close every connection so the pumps end.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Ok(streams) = self.shared.streams.lock() {
            for stream in streams.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}
