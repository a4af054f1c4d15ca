//! The commands when nodes are down, hung, or hold garbage.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{parse, show, Fixture, PASSWORD};
use crate::cli::redcron;

/// A node killed: the commands answer from the other two and name it, on stderr and in `missing_nodes`.
#[test]
fn a_missing_node_is_named_and_the_majority_answers() {
    let mut fixture = Fixture::new();
    let ticks = fixture.seed();
    fixture.cluster.kill(2);
    let node = format!("redis://:***@127.0.0.1:{}", fixture.cluster.port(2));
    let (code, stdout, stderr) = fixture.run(&["history", "--job", "archive", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("warning: node {node} did not answer")),
        "{stderr}"
    );
    let json = parse(&stdout);
    assert_eq!(json["missing_nodes"][0]["node"], node.as_str());
    assert_eq!(json["entries"].as_array().expect("entries").len(), 7);
    assert_eq!(json["ticks"].as_array().expect("ticks").len(), 4);
    for args in [vec!["status"], vec!["explain", "archive", &show(ticks[0])]] {
        let (code, stdout, stderr) = fixture.run(&args);
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains(&node), "{args:?}: {stderr}");
        assert!(!stdout.is_empty());
    }
}

/// No majority (one node killed, one hung): exit 3 and an error naming both, without their password,
/// within the command's bound.
#[test]
fn no_majority_exits_3_naming_the_nodes() {
    let mut fixture = Fixture::new();
    fixture.seed();
    fixture.cluster.kill(1);
    fixture.cluster.stop(2);
    for args in [
        vec!["status"],
        vec!["history"],
        vec!["explain", "archive", "2026-01-01T00:00:00Z"],
    ] {
        let mut command = redcron(fixture.dir.path());
        command.args(&args).arg("-c").arg(&fixture.config);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn redcron");
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?} did not end within 60 s with a hung node");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
        assert!(stderr.contains("error: the store could not be reached: no majority: 1 of 3 nodes answered, 2 needed"), "{stderr}");
        for i in [1, 2] {
            let node = format!("redis://:***@127.0.0.1:{}", fixture.cluster.port(i));
            assert!(stderr.contains(&node), "{node} not named in {stderr}");
        }
        assert!(!stderr.contains(PASSWORD), "{stderr}");
    }
    fixture.cluster.cont(2);
}

/// A node holding a garbage entry: it is skipped with a warning naming the node; the other entries, and
/// the same ones from the other nodes, still come out.
#[test]
fn a_garbage_entry_is_skipped_with_a_warning() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let id = format!("{}|ghost|run", ticks[0].as_millis());
    let _: i64 = fixture.cluster.query(
        0,
        redis::cmd("HSET")
            .arg("redcron:{archive}:history")
            .arg(&id)
            .arg("{not json"),
    );
    let _: i64 = fixture.cluster.query(
        0,
        redis::cmd("ZADD")
            .arg("redcron:{archive}:history:index")
            .arg(ticks[0].as_millis())
            .arg(&id),
    );
    let node = format!("redis://:***@127.0.0.1:{}", fixture.cluster.port(0));
    let (code, stdout, stderr) = fixture.run(&["history", "--job", "archive"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("warning: {node}: history entry skipped:")),
        "{stderr}"
    );
    // A header and the 4 ticks, one line each.
    assert_eq!(stdout.lines().count(), 5, "{stdout}");
    for args in [
        vec!["status", "--json"],
        vec!["explain", "archive", &show(ticks[0]), "--json"],
    ] {
        let (code, stdout, stderr) = fixture.run(&args);
        assert_eq!(code, 0, "{stderr}");
        let json = parse(&stdout);
        assert!(
            json["skipped"][0]
                .as_str()
                .expect("a skipped item")
                .starts_with(&node),
            "{json}"
        );
    }
}
