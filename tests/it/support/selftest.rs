//! Tests of the support module itself: if these fail, no other integration test means anything.

use std::process::Command;
use std::time::Duration;

use super::children;
use super::{Persistence, RedisCluster, TestDir, Worker};

fn is_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as libc::pid_t, 0) != 0 }
}

/// Nodes start on distinct ports and answer; a killed node refuses, and comes back empty on restart.
#[test]
fn cluster_kill_and_restart_without_persistence() {
    let mut cluster = RedisCluster::start(3);
    assert_eq!(cluster.len(), 3);
    let mut urls = cluster.urls();
    urls.dedup();
    assert_eq!(urls.len(), 3, "{urls:?}");
    assert!((0..3).all(|i| cluster.ping(i)));

    let () = cluster.query(1, redis::cmd("SET").arg("k").arg("v"));
    assert_eq!(cluster.get(1, "k").as_deref(), Some("v"));
    let port = cluster.port(1);
    cluster.kill(1);
    assert!(!cluster.ping(1));
    assert!(
        cluster.ping(0) && cluster.ping(2),
        "other nodes are unaffected"
    );

    cluster.restart(1);
    assert_eq!(cluster.port(1), port, "same port after restart");
    assert!(cluster.ping(1));
    assert_eq!(cluster.get(1, "k"), None, "no persistence: data is gone");
}

/// With AOF (fsync always), an acknowledged write survives SIGKILL and restart.
#[test]
fn cluster_restart_keeps_data_with_aof() {
    let mut cluster = RedisCluster::builder()
        .nodes(1)
        .persistence(Persistence::AppendOnlyAlways)
        .start();
    let () = cluster.query(0, redis::cmd("SET").arg("k").arg("kept"));
    cluster.kill(0);
    cluster.restart(0);
    assert_eq!(cluster.get(0, "k").as_deref(), Some("kept"));
    cluster.flushall(0);
    assert!(cluster.keys(0, "*").is_empty());
}

/// A node started with a password refuses a client without it and answers one with it (its URL).
#[test]
fn cluster_with_password() {
    let cluster = RedisCluster::builder().nodes(1).password("pw-4711").start();
    assert_eq!(
        cluster.url(0),
        format!("redis://:pw-4711@127.0.0.1:{}", cluster.port(0))
    );
    assert!(cluster.ping(0));
    let bare = format!("redis://127.0.0.1:{}", cluster.port(0));
    let mut connection = redis::Client::open(bare)
        .expect("a valid URL")
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("the port accepts connections");
    let refused = redis::cmd("PING").query::<String>(&mut connection);
    assert!(refused.is_err(), "{refused:?}");
}

/// A stopped node is hung (no answer), and answers again once continued.
#[test]
fn cluster_stop_and_cont() {
    let mut cluster = RedisCluster::start(1);
    cluster.stop(0);
    assert!(!cluster.ping(0), "a stopped node must not answer");
    cluster.cont(0);
    assert!(cluster.ping(0));
}

/// Dropping the cluster kills every node, stopped ones included.
#[test]
fn cluster_drop_kills_nodes() {
    let mut cluster = RedisCluster::start(2);
    cluster.stop(1);
    let pids: Vec<u32> = (0..2).filter_map(|i| cluster.pid(i)).collect();
    assert_eq!(pids.len(), 2);
    drop(cluster);
    assert!(pids.iter().all(|&pid| is_gone(pid)), "{pids:?}");
}

/// Descendants are found through `/proc`, grandchildren included, and can be killed.
#[test]
fn descendants_are_found_and_killed() {
    let mut command = Command::new("sh");
    command.args(["-c", "sleep 100 & sleep 100; wait"]);
    command.stderr(std::process::Stdio::null()); // sh reports its killed jobs there
    let mut child = children::spawn(command).expect("sh runs");
    let mut found = Vec::new();
    for _ in 0..200 {
        found = children::descendants(child.id());
        if found.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(found.len(), 2, "{found:?}");
    found.iter().for_each(|process| process.kill());
    assert!(children::wait_timeout(&mut child, Duration::from_secs(5)).is_some());
}

/// TestDir writes and reads files; the ledger is empty until written.
#[test]
fn test_dir_files() {
    let dir = TestDir::new();
    assert!(dir.ledger_lines().is_empty());
    std::fs::write(dir.ledger(), "1\n2\n").expect("writable");
    assert_eq!(dir.ledger_lines(), ["1", "2"]);
    let config = dir.write_config("jobs: []\n");
    assert_eq!(config, dir.join("jobs.yaml"));
    assert_eq!(dir.read("jobs.yaml").as_deref(), Some("jobs: []\n"));
    assert_eq!(dir.read("missing"), None);
}

/// A worker pointed at a missing config exits by itself, and its stdout is JSON lines only.
#[test]
fn worker_with_missing_config_exits() {
    let dir = TestDir::new();
    let mut worker = Worker::spawn(dir.join("missing.yaml"), &[("REDCRON_TEST", "1")]);
    assert!(
        worker.wait_timeout(Duration::from_secs(10)).is_some(),
        "{}",
        worker.stderr()
    );
    let _ = worker.logs();
    assert_eq!(
        worker.wait_for_event("never.logged", Duration::from_millis(100)),
        None
    );
}

/// `WorkerBuilder::faketime` finds the preload library that the `faketime` package installs.
#[test]
fn libfaketime_is_found() {
    super::require_program("faketime", "faketime");
    let library = super::libfaketime().expect("libfaketime.so.1 is installed with faketime");
    assert!(library.is_file(), "{}", library.display());
}
