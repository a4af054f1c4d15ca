//! A TCP proxy in front of one lock node: the slow, lossy network link of the plan.
//!
//! Workers list the proxy's address instead of the node's, so every request to that node crosses it. In
//! [`ProxyMode::Slow`] each chunk read from either side waits a random 0..=max ms before it is written on
//! (in order: a direction is one sequential pump); in [`ProxyMode::Flaky`] a chunk may also close the
//! connection, as a reset link would, and the worker's client must reconnect. [`Proxy::cut`] closes every
//! open connection at once. The proxy runs on its own small tokio runtime, shut down on drop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::faults::ProxyMode;
use super::plan::SplitMix64;

/// Counters for the summary.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub connections: AtomicU64,
    pub dropped: AtomicU64,
    pub delayed_chunks: AtomicU64,
}

pub struct Proxy {
    port: u16,
    mode: watch::Sender<ProxyMode>,
    /// Bumped by [`Proxy::cut`]; every connection closes when it changes.
    cuts: watch::Sender<u64>,
    stats: Arc<ProxyStats>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream_port`; `seed` drives the random delays
    /// and drops (per connection, so the sequence does not depend on how connections interleave).
    pub fn start(upstream_port: u16, seed: u64) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("chaos-proxy")
            .enable_all()
            .build()
            .expect("cannot start the proxy's runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("cannot bind the proxy on loopback");
        let port = listener
            .local_addr()
            .expect("a bound socket has an address")
            .port();
        let (mode, mode_rx) = watch::channel(ProxyMode::Clean);
        let (cuts, cuts_rx) = watch::channel(0u64);
        let stats = Arc::new(ProxyStats::default());
        runtime.spawn(accept(
            listener,
            upstream_port,
            seed,
            mode_rx,
            cuts_rx,
            Arc::clone(&stats),
        ));
        Proxy {
            port,
            mode,
            cuts,
            stats,
            runtime: Some(runtime),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// Closes every open connection now.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept(
    listener: TcpListener,
    upstream_port: u16,
    seed: u64,
    mode: watch::Receiver<ProxyMode>,
    cuts: watch::Receiver<u64>,
    stats: Arc<ProxyStats>,
) {
    let mut count = 0u64;
    while let Ok((client, _)) = listener.accept().await {
        count += 1;
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let rng = SplitMix64::new(seed ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        tokio::spawn(connection(
            client,
            upstream_port,
            rng,
            mode.clone(),
            cuts.clone(),
            Arc::clone(&stats),
        ));
    }
}

/// Forwards one connection until either side closes, a flaky chunk drops it, or it is cut.
async fn connection(
    client: TcpStream,
    upstream_port: u16,
    mut rng: SplitMix64,
    mode: watch::Receiver<ProxyMode>,
    mut cuts: watch::Receiver<u64>,
    stats: Arc<ProxyStats>,
) {
    cuts.mark_unchanged();
    let connect = TcpStream::connect(("127.0.0.1", upstream_port));
    // A killed node refuses at once; a hung one still completes the handshake (the kernel does it).
    let Ok(Ok(upstream)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let mut other = SplitMix64::new(rng.next_u64());
    tokio::select! {
        _ = pump(client_read, upstream_write, &mut rng, &mode, &stats) => {}
        _ = pump(upstream_read, client_write, &mut other, &mode, &stats) => {}
        _ = cuts.changed() => {}
    }
    // Dropping both halves of both sockets closes the connection on both sides.
}

/// Copies `from` to `to` chunk by chunk, applying the current mode to each chunk; returns when the
/// connection should close.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    rng: &mut SplitMix64,
    mode: &watch::Receiver<ProxyMode>,
    stats: &ProxyStats,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let current = *mode.borrow();
        let (max_ms, drop_per_mille) = match current {
            ProxyMode::Clean => (0, 0),
            ProxyMode::Slow { max_ms } => (max_ms, 0),
            ProxyMode::Flaky {
                max_ms,
                drop_per_mille,
            } => (max_ms, drop_per_mille),
        };
        if drop_per_mille > 0 && rng.chance(drop_per_mille) {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if max_ms > 0 {
            stats.delayed_chunks.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(rng.between(0, max_ms))).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener as StdListener;
    use std::time::Instant;

    use super::*;

    /// An echo server on loopback; returns its port.
    fn echo_server() -> u16 {
        let listener = StdListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut buffer = [0u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buffer) {
                        if stream.write_all(&buffer[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    fn round_trip(port: u16) -> std::io::Result<Duration> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let start = Instant::now();
        stream.write_all(b"ping")?;
        let mut reply = [0u8; 4];
        stream.read_exact(&mut reply)?;
        assert_eq!(&reply, b"ping");
        Ok(start.elapsed())
    }

    /// Clean forwards, slow delays, flaky drops some connections, and a cut closes open ones.
    #[test]
    fn proxy_forwards_delays_drops_and_cuts() {
        let proxy = Proxy::start(echo_server(), 1);
        round_trip(proxy.port()).expect("clean proxy forwards");

        proxy.set(ProxyMode::Slow { max_ms: 60 });
        let slowest = (0..20)
            .map(|_| round_trip(proxy.port()).expect("slow proxy forwards"))
            .max()
            .expect("20 round trips");
        assert!(
            slowest >= Duration::from_millis(20),
            "slowest round trip {slowest:?}"
        );

        proxy.set(ProxyMode::Flaky {
            max_ms: 0,
            drop_per_mille: 500,
        });
        let failed = (0..40)
            .filter(|_| round_trip(proxy.port()).is_err())
            .count();
        assert!(failed > 0, "no connection dropped");
        assert!(proxy.stats().dropped.load(Ordering::Relaxed) > 0);

        proxy.set(ProxyMode::Clean);
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect");
        stream.write_all(b"ping").expect("write");
        let mut reply = [0u8; 4];
        stream.read_exact(&mut reply).expect("echo");
        proxy.cut();
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let _ = stream.write_all(b"ping");
        let mut rest = [0u8; 4];
        assert!(
            matches!(stream.read(&mut rest), Ok(0) | Err(_)),
            "a cut connection is closed"
        );
    }
}
