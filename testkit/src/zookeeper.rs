//! [`ZkEnsemble`]: one ZooKeeper ensemble of N members (3 by default) on free loopback ports, to crash,
//! hang and revive.
//!
//! The ZooKeeper store's argument is about members that crash, hang and come back, about the leader
//! changing under a claim, and about sessions that outlive neither their timeout nor their holder, so each
//! member can be killed (SIGKILL), hung (SIGSTOP), continued, and restarted on its ports and data directory;
//! [`ZkEnsemble::leader`] says which member leads. The servers are Debian's `zookeeper` package
//! (`QuorumPeerMain` from `/usr/share/java/zookeeper.jar`, run by `java`), each in a directory of its own
//! with its `zoo.cfg`, `myid`, data and logs, the admin server off and only the `srvr`, `ruok` and `mntr`
//! four-letter words allowed. An ensemble counts as started once a member says it leads (`srvr`) and a
//! client session can be created through every member (a session is a write the quorum commits, so that
//! proves the quorum serves) whose own process listens on its client port ([`crate::ports`]); one that never does fails the test with the members' logs, and every member
//! is killed on drop (and with the test binary: [`children`]).
//!
//! Timing: `tickTime` is 250 ms, so ZooKeeper accepts session timeouts from 500 ms to 20 s (the store's
//! 4 s ones included), a follower that stops answering is dropped by the leader after `syncLimit` (2 s), and
//! an election after a leader's crash takes about a second on an idle machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::children;

mod config;
mod shared;
mod wire;

use self::wire::four_letter_word;

pub use self::shared::SharedZk;
pub use self::wire::{Node, WireError, ZkSession, NODE_EXISTS, NOT_EMPTY, NO_NODE};

/// How long a starting ensemble (or a restarted member) may take to serve: a JVM's start on a loaded
/// 2-core machine, three at once, and an election.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The ZooKeeper server's jar (its manifest names its dependencies), the logging binding it lacks, and
/// the two Netty jars its manifest misses (the TLS port's Netty server needs them).
const CLASSPATH: &[&str] = &[
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-log4j12.jar",
    "/usr/share/java/log4j-1.2.jar",
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
];

/// N ZooKeeper members of one ensemble, all killed (and their directory removed) on drop.
pub struct ZkEnsemble {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    /// The TLS client port of an ensemble made by [`ZkEnsemble::with_tls`] (one member).
    secure_port: Option<u16>,
}

struct Member {
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    child: Option<Child>,
    stopped: bool,
}

impl ZkEnsemble {
    /// An ensemble of `n` members (1 runs standalone); waits until it serves, panics (with the logs)
    /// otherwise. A member that finds one of its ports taken meanwhile (another test's process bound it
    /// between the check and the JVM's bind) makes the whole ensemble start again on new ones, a few times.
    pub fn start(n: usize) -> ZkEnsemble {
        ZkEnsemble::start_with(n, false)
    }

    /// One member that also serves clients over TLS on a port of its own ([`Self::secure_address`]),
    /// requiring a client certificate signed by its CA ([`Self::certificate`], made with `openssl`); its
    /// plain port stays open for the harness's own checks.
    pub fn with_tls() -> ZkEnsemble {
        ZkEnsemble::start_with(1, true)
    }

    /// `127.0.0.1:<TLS port>` of an ensemble made by [`Self::with_tls`].
    pub fn secure_address(&self) -> Option<String> {
        self.secure_port.map(|port| format!("127.0.0.1:{port}"))
    }

    /// The CA of a TLS ensemble (`ca.pem`), and a certificate it signed for 127.0.0.1 with its key
    /// (`cert.pem`, `key.pem`): the member's own, and a client certificate it accepts.
    pub fn certificate(&self) -> (PathBuf, PathBuf, PathBuf) {
        let path = |name: &str| self.dir.path().join(name);
        (path("ca.pem"), path("cert.pem"), path("key.pem"))
    }

    fn start_with(n: usize, tls: bool) -> ZkEnsemble {
        assert!(n >= 1, "an ensemble has at least one member");
        crate::require_program("java", "default-jre-headless");
        assert!(
            Path::new(CLASSPATH[0]).is_file(),
            "{} not found; these tests need it. Install it with: \
             apt-get update && apt-get install -y zookeeper",
            CLASSPATH[0]
        );
        for attempt in 1..=5 {
            let ensemble = ZkEnsemble::spawned(n, tls);
            match ensemble.try_wait_serving(&(0..n).collect::<Vec<_>>()) {
                Ok(()) => return ensemble,
                Err(log) if attempt < 5 && log.contains("Address already in use") => continue,
                Err(log) => panic!("{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `n` members spawned on fresh free ports in a new directory, not yet waited for.
    fn spawned(n: usize, tls: bool) -> ZkEnsemble {
        let dir = tempfile::Builder::new()
            .prefix("redcron-zk-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut ports = crate::free_ports(3 * n + 1);
        let secure_port = ports.pop().filter(|_| tls);
        if tls {
            crate::require_program("openssl", "openssl");
            crate::etcd::make_certificates(dir.path());
            // ZooKeeper's PEM key store is the certificate and its key in one file.
            let read = |name: &str| std::fs::read(dir.path().join(name)).expect("a PEM file");
            std::fs::write(
                dir.path().join("server.pem"),
                [read("cert.pem"), read("key.pem")].concat(),
            )
            .expect("cannot write the key store");
        }
        let mut ensemble = ZkEnsemble {
            members: (0..n)
                .map(|i| Member {
                    client_port: ports[3 * i],
                    quorum_port: ports[3 * i + 1],
                    election_port: ports[3 * i + 2],
                    child: None,
                    stopped: false,
                })
                .collect(),
            dir,
            secure_port,
        };
        for i in 0..n {
            ensemble.write_config(i);
        }
        for i in 0..n {
            ensemble.spawn(i);
        }
        ensemble
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `127.0.0.1:<client port>` of every member, in order: what `zookeeper.hosts` of a `jobs.yaml` lists.
    pub fn addresses(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.address(i)).collect()
    }

    /// `127.0.0.1:<client port>` of member `i`.
    pub fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Whether member `i`'s own process listens on its client port, so that what answers there is this
    /// member and not another test's ensemble ([`crate::ports`]).
    fn listens(&self, i: usize) -> bool {
        self.pid(i)
            .is_some_and(|pid| crate::ports::listened_on_by(pid, self.client_port(i)))
    }

    /// Whether member `i` runs and is not hung.
    pub fn is_serving(&self, i: usize) -> bool {
        self.members[i].child.is_some() && !self.members[i].stopped
    }

    /// The member that says it leads now (`srvr`: `Mode: leader`, or `standalone` for an ensemble of
    /// one), asking each serving member once: `None` during an election.
    pub fn leader(&self) -> Option<usize> {
        (0..self.len()).filter(|&i| self.is_serving(i)).find(|&i| {
            self.mode(i)
                .is_some_and(|m| m == "leader" || m == "standalone")
        })
    }

    /// [`Self::leader`], waiting up to `timeout` for one; panics with the logs if none is elected.
    pub fn wait_leader(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader() {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no ZooKeeper leader within {timeout:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A member that runs, is not hung and follows: one to kill without an election.
    pub fn follower(&self) -> Option<usize> {
        (0..self.len())
            .filter(|&i| self.is_serving(i))
            .find(|&i| self.mode(i).as_deref() == Some("follower"))
    }

    /// Member `i`'s `Mode:` (`leader`, `follower`, `standalone`), or `None` if it does not serve.
    pub fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letter_word(self.members[i].client_port, "srvr")?;
        let mode = answer.lines().find_map(|l| l.strip_prefix("Mode: "))?;
        Some(mode.trim().to_string())
    }

    /// Member `i`'s answer to `srvr` (version, latency, connections, zxid, mode, node count), if any.
    pub fn srvr(&self, i: usize) -> Option<String> {
        four_letter_word(self.members[i].client_port, "srvr")
    }

    /// A session of the harness's own client ([`ZkSession`], 10 s) on the first serving member that
    /// grants one; panics (with the logs) if none does.
    pub fn session(&self) -> ZkSession {
        (0..self.len())
            .filter(|&i| self.is_serving(i))
            .find_map(|i| ZkSession::connect(self.client_port(i), Duration::from_secs(10)).ok())
            .unwrap_or_else(|| panic!("no ZooKeeper member grants a session:\n{}", self.logs()))
    }

    /// Deletes every node but ZooKeeper's own (`/zookeeper`); panics if that fails.
    pub fn delete_all(&self) {
        self.session()
            .delete_tree("/")
            .unwrap_or_else(|e| panic!("cannot empty the ZooKeeper ensemble: {e}"));
    }

    /// Crashes member `i` (SIGKILL, and reap it); its client port refuses connections until
    /// [`Self::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            children::kill_and_reap(&mut child);
        }
        self.members[i].stopped = false;
    }

    /// Hangs member `i` (SIGSTOP): connections are accepted but get no answer, and its peers hear
    /// nothing from it.
    pub fn stop(&mut self, i: usize) {
        let pid = self
            .pid(i)
            .unwrap_or_else(|| panic!("ZooKeeper member {i} is not running"));
        children::signal(pid, libc::SIGSTOP);
        self.members[i].stopped = true;
    }

    /// Resumes a member hung by [`Self::stop`].
    pub fn cont(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            children::signal(pid, libc::SIGCONT);
        }
        self.members[i].stopped = false;
    }

    /// Kills member `i` if it runs and starts it again on its ports and data directory; waits until it
    /// serves again (it rejoins the quorum with its data and syncs from the leader).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        if let Err(log) = self.try_wait_serving(&[i]) {
            panic!("{log}");
        }
    }

    /// Every member's log (its own, and what the JVM wrote).
    pub fn logs(&self) -> String {
        (0..self.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.member_dir(i).join("zookeeper.log"));
                format!("--- ZooKeeper member {i}:\n{}", log.unwrap_or_default())
            })
            .collect()
    }

    /// Member `i`'s data directory (`dataDir`): its snapshots and transaction logs are in `version-2/`.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.member_dir(i).join("data")
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{i}"))
    }

    /// Member `i`'s directory: `zoo.cfg`, `log4j.properties`, `data/myid` ([`config`]).
    fn write_config(&self, i: usize) {
        // A standalone member names no peers.
        let peers: Vec<(u16, u16)> = if self.len() > 1 {
            (self.members.iter())
                .map(|m| (m.quorum_port, m.election_port))
                .collect()
        } else {
            Vec::new()
        };
        let tls = self.secure_port.map(|port| (port, self.dir.path()));
        config::write(
            &self.member_dir(i),
            i,
            self.members[i].client_port,
            &peers,
            tls,
        );
    }

    fn spawn(&mut self, i: usize) {
        let dir = self.member_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("zookeeper.log"))
            .expect("cannot create a log file");
        let mut command = Command::new("java");
        command
            .args(["-Xmx128m", "-Xms32m", "-XX:+UseSerialGC", "-Xss512k"])
            // The JIT's first tier only: a JVM that starts (and elects) sooner on a loaded machine.
            .arg("-XX:TieredStopAtLevel=1")
            .arg(format!(
                "-Dlog4j.configuration=file:{}",
                dir.join("log4j.properties").display()
            ))
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            .args(["-cp", &CLASSPATH.join(":")])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(dir.join("zoo.cfg"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cannot duplicate a file handle"))
            .stderr(log);
        let child = children::spawn(command).unwrap_or_else(|e| panic!("cannot run java: {e}"));
        self.members[i].child = Some(child);
        self.members[i].stopped = false;
    }

    /// Waits until the ensemble has a leader and a client session can be created through each of
    /// `members`; otherwise what went wrong and the members' logs.
    fn try_wait_serving(&self, members: &[usize]) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut waiting: Vec<usize> = members.to_vec();
        while !waiting.is_empty() {
            for &i in members {
                if let Some(child) = self.members[i].child.as_ref() {
                    // `try_wait` needs `&mut`; a member that exited has no process under its pid.
                    if !Path::new(&format!("/proc/{}", child.id())).exists()
                        || is_zombie(child.id())
                    {
                        return Err(format!("ZooKeeper member {i} exited:\n{}", self.logs()));
                    }
                }
            }
            if self.leader().is_some() {
                // A session through the port proves a serving member there; that it is member `i`
                // takes its own process listening on it ([`crate::ports`]).
                waiting.retain(|&i| !(self.listens(i) && session_created(self.client_port(i))));
            }
            if waiting.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let foreign: Vec<usize> = waiting
                    .iter()
                    .copied()
                    .filter(|&i| !self.listens(i))
                    .collect();
                let whose = if foreign.is_empty() {
                    String::new()
                } else {
                    format!(" (members {foreign:?} do not listen on their ports: Address already in use?)")
                };
                return Err(format!(
                    "ZooKeeper members {waiting:?} not serving within {READY_TIMEOUT:?}{whose}:\n{}",
                    self.logs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

impl Drop for ZkEnsemble {
    /// Kills every member, hung ones included, and reaps them; the directory goes with `dir`.
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                children::kill_and_reap(&mut child);
            }
        }
    }
}

/// Whether `pid` is a zombie (exited, not yet reaped), from `/proc/<pid>/stat`.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Whether a client session can be created through the member on `port` (a session's creation is a
/// write the quorum commits); the session is closed again.
fn session_created(port: u16) -> bool {
    ZkSession::connect(port, Duration::from_secs(2)).is_ok()
}

#[cfg(test)]
mod tests;
