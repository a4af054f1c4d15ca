//! [`EtcdCluster`]: one etcd cluster of N members (3 by default) on free loopback ports, to crash and
//! revive.
//!
//! The etcd store's argument is about members that crash, hang and come back, and about the leader
//! changing under a claim, so each member can be killed (SIGKILL), hung (SIGSTOP), continued, and
//! restarted on its ports and data directory; [`EtcdCluster::leader`] says which member leads. As for
//! Redis nodes, the cluster counts as started only once every member reports itself healthy (`/health`:
//! a leader exists) and its own process listens on its ports ([`crate::ports`]), a cluster that never does fails the test with the members' logs, and every member
//! is killed on drop. Elections are fast (heartbeat 50 ms, election timeout 500 ms), so a test waits
//! about a second for a new leader, and etcd's shortest lease TTL is one second. A cluster may serve its
//! clients over TLS only, requiring client certificates ([`EtcdCluster::with_tls`]); health is read
//! from each member's plain-HTTP metrics port either way, as are the member's own counters
//! ([`EtcdCluster::metrics`]) that the benchmark reads.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::children;

/// How long a starting cluster (or a restarted member) may take to report itself healthy. etcd 3.4's
/// `/health` is a linearizable read: a member restarted in a chaos run on a loaded 2-core machine
/// catches up with the leader before it answers one, and took more than 20 s to (with the cluster
/// serving claims all along); a member that never comes up still fails the test, a minute later.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// N `etcd` members of one cluster, all killed on drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    tls: bool,
}

struct Member {
    client_port: u16,
    peer_port: u16,
    metrics_port: u16,
    child: Option<Child>,
    stopped: bool,
}

impl EtcdCluster {
    /// A cluster of three members.
    pub fn start() -> EtcdCluster {
        EtcdCluster::with_members(3)
    }

    /// A cluster of `n` members; waits until every member is healthy, panics (with the logs) otherwise.
    pub fn with_members(n: usize) -> EtcdCluster {
        EtcdCluster::new(n, false)
    }

    /// One member that serves its clients over TLS only (a self-signed certificate for 127.0.0.1, made
    /// with `openssl`: [`Self::certificate`]) and requires a client certificate signed by it.
    pub fn with_tls() -> EtcdCluster {
        EtcdCluster::new(1, true)
    }

    /// The CA of a TLS cluster (`ca.pem`), and a certificate it signed for 127.0.0.1 with its key
    /// (`cert.pem`, `key.pem`): the member's own, and a client certificate it accepts.
    pub fn certificate(&self) -> (PathBuf, PathBuf, PathBuf) {
        let path = |name: &str| self.dir.path().join(name);
        (path("ca.pem"), path("cert.pem"), path("key.pem"))
    }

    /// Starts `n` members on fresh free ports; a member that finds one of its ports taken meanwhile (another
    /// test's process bound it between the check and etcd's bind) makes the whole cluster start again on
    /// new ones, a few times.
    fn new(n: usize, tls: bool) -> EtcdCluster {
        crate::require_program("etcd", "etcd-server");
        for attempt in 1..=5 {
            let mut cluster = EtcdCluster::spawned(n, tls);
            match cluster.try_wait_healthy((0..n).collect()) {
                Ok(()) => return cluster,
                Err(log) if attempt < 5 && log.contains("address already in use") => continue,
                Err(log) => panic!("{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Saves a snapshot of the cluster's keyspace to `path`, through member 0 (`etcdctl snapshot save`,
    /// Debian's `etcd-client`); panics with etcdctl's output if that fails.
    pub fn snapshot_save(&self, path: &Path) {
        crate::require_program("etcdctl", "etcd-client");
        let output = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint(0), "snapshot", "save"])
            .arg(path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run etcdctl: {e}"));
        assert!(
            output.status.success(),
            "etcdctl snapshot save failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A new cluster of `n` members on fresh ports, each member's data restored from `snapshot`
    /// (`etcdctl snapshot restore`, as an operator restores a cluster): the keys as they were when it was
    /// saved, at its revision. Waits until every member is healthy, panics (with the logs) otherwise.
    pub fn restored_from(snapshot: &Path, n: usize) -> EtcdCluster {
        crate::require_program("etcd", "etcd-server");
        crate::require_program("etcdctl", "etcd-client");
        for attempt in 1..=5 {
            let mut cluster = EtcdCluster::spawned_with(n, false, Some(snapshot));
            match cluster.try_wait_healthy((0..n).collect()) {
                Ok(()) => return cluster,
                Err(log) if attempt < 5 && log.contains("address already in use") => continue,
                Err(log) => panic!("{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Restores member `i`'s data directory from `snapshot`, as a member of this cluster.
    fn restore(&self, i: usize, snapshot: &Path) {
        let dir = self.member_dir(i);
        std::fs::create_dir_all(&dir).expect("cannot create a member directory");
        let output = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--initial-cluster", &self.peers().join(",")])
            .args(["--initial-cluster-token", "redcron-test"])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", self.members[i].peer_port),
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run etcdctl: {e}"));
        assert!(
            output.status.success(),
            "etcdctl snapshot restore failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Every member's `name=peer URL`, as `--initial-cluster` lists them.
    fn peers(&self) -> Vec<String> {
        (0..self.len())
            .map(|m| format!("m{m}=http://127.0.0.1:{}", self.members[m].peer_port))
            .collect()
    }

    /// `n` members spawned on fresh free ports in a new directory, not yet waited for.
    fn spawned(n: usize, tls: bool) -> EtcdCluster {
        EtcdCluster::spawned_with(n, tls, None)
    }

    /// [`Self::spawned`], each member's data first restored from `snapshot` if given.
    fn spawned_with(n: usize, tls: bool, snapshot: Option<&Path>) -> EtcdCluster {
        let dir = tempfile::Builder::new()
            .prefix("redcron-etcd-")
            .tempdir()
            .expect("cannot create a temporary directory");
        if tls {
            crate::require_program("openssl", "openssl");
            make_certificates(dir.path());
        }
        let ports = crate::free_ports(3 * n);
        let mut cluster = EtcdCluster {
            members: (0..n)
                .map(|i| Member {
                    client_port: ports[3 * i],
                    peer_port: ports[3 * i + 1],
                    metrics_port: ports[3 * i + 2],
                    child: None,
                    stopped: false,
                })
                .collect(),
            dir,
            tls,
        };
        for i in 0..n {
            if let Some(snapshot) = snapshot {
                cluster.restore(i, snapshot);
            }
            cluster.spawn(i, true);
        }
        cluster
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `http://127.0.0.1:<client port>` of member `i` (`https://` for a TLS cluster).
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's endpoint, in order: what `etcd.endpoints` of a `jobs.yaml` lists.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The endpoints as a YAML flow list.
    pub fn endpoints_yaml(&self) -> String {
        let quoted: Vec<String> = self
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        format!("[{}]", quoted.join(", "))
    }

    /// The member that leads now, as far as a serving member says (waits up to 10 s for one).
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(leader) = self.current_leader() {
                return leader;
            }
            assert!(Instant::now() < deadline, "no etcd leader within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The serving member that says it leads, asking each once (`None` during an election): for a
    /// caller that must not wait.
    pub fn current_leader(&self) -> Option<usize> {
        (0..self.len()).filter(|i| self.is_serving(*i)).find(|&i| {
            self.status(i)
                .is_some_and(|(me, leader)| me == leader && leader != "0")
        })
    }

    /// Member `i`'s client port (plain HTTP unless TLS): etcd's JSON gateway answers there too.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Whether member `i` runs and is not hung.
    pub fn is_serving(&self, i: usize) -> bool {
        self.members[i].child.is_some() && !self.members[i].stopped
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Member `i`'s Prometheus text (`/metrics` on its metrics port), or `None` if it does not answer.
    pub fn metrics(&self, i: usize) -> Option<String> {
        http(self.members[i].metrics_port, "GET /metrics", "")
    }

    /// Deletes every key (through the first serving member's JSON gateway); panics if none answers.
    pub fn delete_all(&self) {
        // The key and range end `\0` (base64 `AA==`) select every key.
        let deleted = (0..self.len()).filter(|i| self.is_serving(*i)).any(|i| {
            http(
                self.members[i].client_port,
                "POST /v3/kv/deleterange",
                r#"{"key":"AA==","range_end":"AA=="}"#,
            )
            .is_some()
        });
        assert!(deleted, "no etcd member deleted the keys");
    }

    /// Crashes member `i` (SIGKILL, and reap it); its ports refuse connections until [`Self::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            children::kill_and_reap(&mut child);
        }
        self.members[i].stopped = false;
    }

    /// Hangs member `i` (SIGSTOP): connections are accepted but get no answer.
    pub fn stop(&mut self, i: usize) {
        let pid = self
            .pid(i)
            .unwrap_or_else(|| panic!("member {i} is not running"));
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
    /// is healthy (it rejoins with its data and catches up from the leader).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i, false);
        self.wait_healthy(vec![i]);
    }

    /// Every member's log.
    pub fn logs(&self) -> String {
        (0..self.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.member_dir(i).join("etcd.log"));
                format!("--- etcd member {i}:\n{}", log.unwrap_or_default())
            })
            .collect()
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{i}"))
    }

    fn spawn(&mut self, i: usize, new: bool) {
        let dir = self.member_dir(i);
        std::fs::create_dir_all(&dir).expect("cannot create a member directory");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("etcd.log"))
            .expect("cannot create a log file");
        let peers = self.peers();
        let (client, peer) = (
            self.endpoint(i),
            format!("http://127.0.0.1:{}", self.members[i].peer_port),
        );
        let mut command = Command::new("etcd");
        command
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &peers.join(",")])
            .args(["--initial-cluster-token", "redcron-test"])
            .args([
                "--initial-cluster-state",
                if new { "new" } else { "existing" },
            ])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", self.members[i].metrics_port),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cannot duplicate a file handle"))
            .stderr(log);
        if self.tls {
            let (ca, cert, key) = self.certificate();
            command
                .arg("--cert-file")
                .arg(&cert)
                .arg("--key-file")
                .arg(&key)
                .arg("--trusted-ca-file")
                .arg(&ca)
                .arg("--client-cert-auth");
        }
        let child = children::spawn(command).unwrap_or_else(|e| panic!("cannot run etcd: {e}"));
        self.members[i].child = Some(child);
        self.members[i].stopped = false;
    }

    /// Waits until each of `members` answers `/health` with a leader; panics with the logs otherwise.
    fn wait_healthy(&mut self, members: Vec<usize>) {
        if let Err(log) = self.try_wait_healthy(members) {
            panic!("{log}");
        }
    }

    /// Waits until each of `members` answers `/health` with a leader; otherwise what went wrong and the
    /// members' logs.
    fn try_wait_healthy(&mut self, members: Vec<usize>) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        for i in members {
            loop {
                if let Some(child) = self.members[i].child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(format!(
                            "etcd member {i} exited ({status}):\n{}",
                            self.logs()
                        ));
                    }
                }
                if http(self.members[i].metrics_port, "GET /health", "")
                    .is_some_and(|body| body.contains("\"health\":\"true\""))
                    && self.listens(i)
                {
                    break;
                }
                if Instant::now() >= deadline {
                    let whose = if self.listens(i) {
                        ""
                    } else {
                        " (it does not listen on its client and metrics ports: another process \
                         holds one?)"
                    };
                    return Err(format!(
                        "etcd member {i} not healthy within {READY_TIMEOUT:?}{whose}:\n{}",
                        self.logs()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Whether member `i`'s own process listens on its client and metrics ports: what answers there
    /// is this member, not another test's server ([`crate::ports`]).
    fn listens(&self, i: usize) -> bool {
        let member = &self.members[i];
        member.child.as_ref().is_some_and(|child| {
            [member.client_port, member.metrics_port]
                .iter()
                .all(|&port| crate::ports::listened_on_by(child.id(), port))
        })
    }

    /// Member `i`'s own id and the leader's id, from its status (`None` if it does not answer).
    fn status(&self, i: usize) -> Option<(String, String)> {
        let body = http(
            self.members[i].client_port,
            "POST /v3/maintenance/status",
            "{}",
        )?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let me = status["header"]["member_id"].as_str()?.to_string();
        let leader = status["leader"].as_str()?.to_string();
        Some((me, leader))
    }
}

impl Drop for EtcdCluster {
    /// Kills every member, hung ones included, and reaps them.
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                children::kill_and_reap(&mut child);
            }
        }
    }
}

/// Whether member `port` (its client port) answers a linearizable read — one that needs the leader
/// to confirm it still leads, so it waits out an election — within `timeout`.
pub fn linearizable_read(port: u16, timeout: Duration) -> bool {
    // The key is `chaos-probe` in base64, as the JSON gateway takes bytes.
    http_within(
        port,
        "POST /v3/kv/range",
        r#"{"key":"Y2hhb3MtcHJvYmU="}"#,
        timeout,
    )
    .is_some()
}

/// One HTTP/1.0 request to a member's client port (etcd's JSON gateway); the body of a 200 answer.
fn http(port: u16, request_line: &str, body: &str) -> Option<String> {
    http_within(port, request_line, body, Duration::from_millis(500))
}

/// [`http`] with a bound of its own on connecting, sending and reading.
fn http_within(port: u16, request_line: &str, body: &str, timeout: Duration) -> Option<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request = format!(
        "{request_line} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_string()))
}

/// A CA (`ca.pem`) and a certificate it signed for 127.0.0.1, for servers and clients alike (`cert.pem`,
/// `key.pem`), in `dir`: rustls refuses a self-signed certificate used as its own CA.
pub(crate) fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("cannot run openssl");
        assert!(status.success(), "openssl {args:?} failed");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=redcron test CA",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "cert.csr",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("cannot write the extensions file");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "cert.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
}
