//! [`DelayProxy`]: a TCP proxy in front of one node that holds back chosen requests — a slow round trip
//! for one kind of command only, as one TCP retransmission or one fsync stall makes it.
//!
//! Bytes from the client are scanned for a marker (e.g. the SHA1 of a script, which every `EVALSHA` of it
//! carries); while delays are armed ([`DelayProxy::delay_next`]), a chunk that contains the marker waits
//! before it is forwarded, and everything behind it on that connection waits too, as on a real link.
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
                std::thread::spawn(move || pump(client_reader, server, Some(&up)));
                std::thread::spawn(move || pump(server_reader, client, None));
            }
        });
        DelayProxy { port, shared }
    }

    /// The URL workers and stores use instead of the node's.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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

/// Copies `from` to `to`; with `delays`, holds back marked chunks while delays are armed.
fn pump(mut from: TcpStream, mut to: TcpStream, delays: Option<&Shared>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(shared) = delays {
            let marked = buffer[..n]
                .windows(shared.marker.len())
                .any(|window| window == shared.marker.as_slice());
            let take = |armed: usize| armed.checked_sub(1);
            if marked
                && shared
                    .armed
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take)
                    .is_ok()
            {
                shared.delayed.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(shared.delay);
            }
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
