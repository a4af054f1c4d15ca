//! Loopback ports for the servers a test starts, and which process listens on one.
//!
//! A port is picked by binding port 0 and closing the socket again; the server binds it a moment
//! later. Two hazards lie in between. The kernel hands a port just released to the next bind(0) as
//! readily as any other (here about one call in seventy returns one of the last 200 released), so two
//! servers started at once by one test binary could both be told to use the same port: this module
//! never hands out a port twice in one process. And another process may bind the port first: so a
//! harness counts a server as started only once [`listened_on_by`] finds *its own* process listening,
//! not when something answers on its port: a ZooKeeper member whose port another ensemble holds passes
//! every earlier readiness check through that ensemble (`zookeeper::tests`), which is the likeliest
//! account of two conformance runs that renewed a lease after hanging every member of their own.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// Every port this process handed out.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// `n` distinct loopback ports that were free a moment ago and that this process never handed out
/// before (the caller retries with new ones if another process takes one first).
pub fn free_ports(n: usize) -> Vec<u16> {
    // A test that panicked while holding the set left it whole: every insert is a single call.
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Every listener stays bound until the end, so that the kernel offers each port once per call.
    let mut bound: Vec<TcpListener> = Vec::new();
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        assert!(
            bound.len() < n + 10_000,
            "no loopback port left that this process has not used"
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind a loopback port");
        let port = listener
            .local_addr()
            .expect("a bound socket has an address")
            .port();
        if handed_out.insert(port) {
            ports.push(port);
        }
        bound.push(listener);
    }
    ports
}

/// A loopback port that was free a moment ago ([`free_ports`]).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// Whether process `pid` has a socket listening on TCP `port` (any address, IPv4 or IPv6), from
/// `/proc/net/tcp{,6}` and `/proc/<pid>/fd`: the proof that a server answering on its port is the one
/// the harness started.
#[cfg(target_os = "linux")]
pub fn listened_on_by(pid: u32, port: u16) -> bool {
    owns_a_socket(pid, |fields| {
        fields.state == LISTEN && fields.local_port == port
    })
}

/// Whether process `pid` has a TCP connection established to `port` (on any address): which member of
/// an ensemble a client in that process talks to, read from `/proc/net/tcp{,6}` and `/proc/<pid>/fd`.
#[cfg(target_os = "linux")]
pub fn connected_to(pid: u32, port: u16) -> bool {
    owns_a_socket(pid, |fields| {
        fields.state == ESTABLISHED && fields.remote_port == port
    })
}

/// Elsewhere the check cannot be made; a server answering on its port is taken to be the one started.
#[cfg(not(target_os = "linux"))]
pub fn listened_on_by(_pid: u32, _port: u16) -> bool {
    true
}

/// Elsewhere the check cannot be made: no connection is found.
#[cfg(not(target_os = "linux"))]
pub fn connected_to(_pid: u32, _port: u16) -> bool {
    false
}

/// The TCP states of `/proc/net/tcp` the checks read.
const ESTABLISHED: &str = "01";
const LISTEN: &str = "0A";

/// The fields of one socket of a `/proc/net/tcp` table the checks read.
struct Socket<'a> {
    local_port: u16,
    remote_port: u16,
    state: &'a str,
    inode: &'a str,
}

/// Whether process `pid` holds a socket of `/proc/net/tcp{,6}` for which `wanted` holds.
#[cfg(target_os = "linux")]
fn owns_a_socket(pid: u32, wanted: impl Fn(&Socket<'_>) -> bool) -> bool {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| inodes(&table, &wanted))
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.to_string();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .any(|inode| inodes.contains(&inode))
}

/// The inodes of the sockets of a `/proc/net/tcp` table for which `wanted` holds.
///
/// A line: `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
/// ...`, each address `HEXADDR:HEXPORT`, state `0A` = LISTEN, `01` = ESTABLISHED.
fn inodes(table: &str, wanted: impl Fn(&Socket<'_>) -> bool) -> Vec<String> {
    let port = |address: &str| u16::from_str_radix(address.rsplit_once(':')?.1, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let socket = Socket {
                local_port: port(fields.get(1)?)?,
                remote_port: port(fields.get(2)?)?,
                state: fields.get(3)?,
                inode: fields.get(9)?,
            };
            wanted(&socket).then(|| socket.inode.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_port_is_handed_out_twice() {
        // Without the record of ports handed out, about one call in seventy returns one of the last 200
        // ports released: 3,000 calls repeat one almost surely.
        let mut seen = BTreeSet::new();
        for _ in 0..1_000 {
            for port in free_ports(3) {
                assert!(seen.insert(port), "port {port} handed out twice");
            }
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_listener_and_a_connection_are_found_in_their_own_process_only() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("an address").port();
        assert!(listened_on_by(std::process::id(), port));
        // Process 1 (init, or the container's first process) does not listen on our port.
        assert!(!listened_on_by(1, port));
        assert!(!connected_to(std::process::id(), port));
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("a connection");
        assert!(connected_to(std::process::id(), port));
        assert!(!connected_to(1, port));
        drop(stream);
        drop(listener);
        assert!(!listened_on_by(std::process::id(), port));
    }

    #[test]
    fn the_table_is_read_by_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                     \x20  0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n\
                     \x20  1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n\
                     \x20  2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0\n";
        let listening = |port: u16| inodes(table, |s| s.state == LISTEN && s.local_port == port);
        assert_eq!(listening(0x1F90), vec!["111".to_string()]);
        assert_eq!(listening(0x1F91), vec!["333".to_string()]);
        assert!(listening(0x1F92).is_empty());
        let connected =
            |port: u16| inodes(table, |s| s.state == ESTABLISHED && s.remote_port == port);
        assert_eq!(connected(0xD431), vec!["222".to_string()]);
        assert!(connected(0x1F90).is_empty());
    }
}
