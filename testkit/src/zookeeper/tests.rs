//! The harness's own ensemble: if it does not start, elect, fail over and die with its handle, no
//! ZooKeeper test means anything.

use std::path::Path;
use std::time::{Duration, Instant};

use super::wire::four_letter_word;
use super::*;

/// Three members start and serve; a follower killed leaves a quorum that serves, a killed leader is
/// replaced, a restarted member serves again, and dropping the ensemble kills every member.
#[test]
fn an_ensemble_starts_elects_and_dies_with_its_handle() {
    let started = Instant::now();
    let mut ensemble = ZkEnsemble::start(3);
    eprintln!("3 ZooKeeper members serving after {:?}", started.elapsed());
    let leader = ensemble.wait_leader(Duration::from_secs(10));
    let follower = ensemble.follower().expect("a follower");
    assert_ne!(leader, follower);

    ensemble.kill(follower);
    assert!(session_created(ensemble.client_port(leader)));

    let killed = Instant::now();
    ensemble.kill(leader);
    let other = (0..3)
        .find(|&i| i != leader && i != follower)
        .expect("3 members");
    ensemble.restart(follower);
    let new_leader = ensemble.wait_leader(Duration::from_secs(30));
    assert_ne!(new_leader, leader);
    eprintln!(
        "a new leader (member {new_leader}) {:?} after the old one was killed",
        killed.elapsed()
    );
    assert!(session_created(ensemble.client_port(other)));

    let restarted = Instant::now();
    ensemble.restart(leader);
    eprintln!(
        "the old leader serves again after {:?}",
        restarted.elapsed()
    );

    let mut session = ensemble.session();
    session.create_all("/redcron/a/b", b"x").expect("created");
    let node = session.get("/redcron/a/b").expect("read back");
    assert_eq!(node.data, b"x");
    assert!(node.czxid > 0 && node.ephemeral_owner == 0);
    assert_eq!(session.children("/redcron").expect("listed"), ["a"]);
    assert!(matches!(
        session.get("/nothing"),
        Err(WireError::Code(NO_NODE))
    ));
    drop(session);
    ensemble.delete_all();
    assert_eq!(
        ensemble.session().children("/").expect("listed"),
        ["zookeeper"]
    );

    ensemble.stop(other);
    assert!(four_letter_word(ensemble.client_port(other), "ruok").is_none());
    ensemble.cont(other);

    let pids: Vec<u32> = (0..3).filter_map(|i| ensemble.pid(i)).collect();
    let dir = ensemble.dir.path().to_path_buf();
    drop(ensemble);
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid));
    }
    assert!(!dir.exists());
}

/// A TLS member hands a client that shows a certificate signed by its CA a verified TLS session on its
/// secure port (checked with `openssl s_client`), and still serves the harness on its plain port.
#[test]
fn a_tls_member_serves_clients_with_certificates() {
    let ensemble = ZkEnsemble::with_tls();
    let address = ensemble.secure_address().expect("a TLS port");
    let (ca, cert, key) = ensemble.certificate();
    let output = std::process::Command::new("openssl")
        .args(["s_client", "-brief", "-connect", &address])
        .arg("-CAfile")
        .arg(&ca)
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("Verification: OK"), "{said}");
    assert!(ZkSession::connect(ensemble.client_port(0), Duration::from_secs(5)).is_ok());
    assert_eq!(ensemble.leader(), Some(0));
}

/// A member whose client port another ensemble holds is not counted as serving because that ensemble
/// answers on the port (a conformance run once hung every member of its own ensemble and still renewed a
/// lease, through another test's): the start fails with "Address already in use", which makes
/// [`ZkEnsemble::start`] try again on new ports.
#[test]
fn a_member_whose_port_another_ensemble_holds_does_not_serve() {
    let other = ZkEnsemble::start(1);
    let mut ensemble = ZkEnsemble::start(1);
    ensemble.kill(0);
    ensemble.members[0].client_port = other.client_port(0);
    ensemble.write_config(0);
    ensemble.spawn(0);
    let error = ensemble
        .try_wait_serving(&[0])
        .expect_err("the port is the other ensemble's");
    assert!(error.contains("Address already in use"), "{error}");
}
