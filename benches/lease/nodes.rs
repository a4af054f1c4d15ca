//! Local `redis-server` nodes for the benchmark, killed on drop.
//!
//! The idea of `tests/it/support/redis.rs` (which a bench cannot import), cut down to what the benchmark
//! needs: free loopback ports, no persistence (`--save "" --appendonly no`: the lease table is in memory,
//! and fsync would measure the disk, not the lock), a node counts as started once it answers PING, a node
//! can be hung with SIGSTOP, and `INFO` can be read without a client library. On Linux every node also
//! dies with the benchmark (`PR_SET_PDEATHSIG`), so an interrupted run leaves nothing behind.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// N `redis-server` processes on free loopback ports.
pub struct Nodes {
    nodes: Vec<(u16, Child)>,
    dir: tempfile::TempDir,
}

impl Nodes {
    /// Starts `n` nodes and waits until each answers PING.
    pub fn start(n: usize) -> io::Result<Nodes> {
        let dir = tempfile::Builder::new()
            .prefix("redcron-bench-")
            .tempdir()?;
        let mut nodes = Nodes {
            nodes: Vec::new(),
            dir,
        };
        for i in 0..n {
            let node_dir = nodes.dir.path().join(format!("node{i}"));
            std::fs::create_dir(&node_dir)?;
            nodes.start_node(&node_dir)?;
        }
        Ok(nodes)
    }

    fn start_node(&mut self, dir: &std::path::Path) -> io::Result<()> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            let mut command = Command::new("redis-server");
            command
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            die_with_parent(&mut command);
            let mut child = command.spawn().map_err(|e| {
                io::Error::new(e.kind(), format!("cannot run redis-server ({e}); install it: apt-get install -y redis-server"))
            })?;
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!(
                        "redis-server exited ({status}): {}",
                        std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
                    );
                    break;
                }
                if query(port, &["PING"], Duration::from_millis(200)).is_ok_and(|r| r == "PONG") {
                    self.nodes.push((port, child));
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = format!("redis-server on port {port} did not answer PING within 5 s");
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(io::Error::other(last))
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].0
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.nodes[i].1.id()
    }

    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.port(i))
    }

    pub fn urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.url(i)).collect()
    }

    /// Hangs node `i` (SIGSTOP): its socket accepts connections and requests, and never answers.
    pub fn hang(&self, i: usize) {
        signal(&self.nodes[i].1, libc::SIGSTOP);
    }

    /// Resumes a node hung by [`Nodes::hang`].
    pub fn resume(&self, i: usize) {
        signal(&self.nodes[i].1, libc::SIGCONT);
    }

    /// `INFO <section>` of node `i`, as `field → value` lines.
    pub fn info(&self, i: usize, section: &str) -> io::Result<Vec<(String, String)>> {
        let text = query(self.port(i), &["INFO", section], Duration::from_secs(2))?;
        Ok(text
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }

    /// Runs one command on node `i` and returns its reply as text.
    pub fn command(&self, i: usize, args: &[&str]) -> io::Result<String> {
        query(self.port(i), args, Duration::from_secs(2))
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            // A stopped process still dies of SIGKILL; SIGCONT first only so that it is reaped at once.
            signal(child, libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill has no memory effects; the pid is our own unreaped child, so it cannot be reused.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
}

/// Asks the kernel to SIGKILL the child when the benchmark exits, however it exits.
pub fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One RESP command over a fresh connection; the reply (simple, bulk or integer) as text.
pub fn query(port: u16, args: &[&str], timeout: Duration) -> io::Result<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end();
    match line.split_at(line.len().min(1)) {
        ("+", rest) | (":", rest) => Ok(rest.to_string()),
        ("-", rest) => Err(io::Error::other(rest.to_string())),
        ("$", len) => {
            let len: usize = len
                .parse()
                .map_err(|_| io::Error::other(format!("bad bulk length {len:?}")))?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            String::from_utf8(body).map_err(|e| io::Error::other(e.to_string()))
        }
        _ => Err(io::Error::other(format!("unexpected reply {line:?}"))),
    }
}
