//! Garbage planted straight into the store — trigger requests with absurd times, that are not JSON, that
//! lack fields or are huge; members that are not announcements — costs a worker a warning per entry, never
//! its trigger poller: it keeps running and a normal `redcron trigger` afterwards still runs the job, once.
//! On Redis, on etcd and on the embedded store, which share the request format.

use std::time::Duration;

use crate::inspect::{inspect, parse};
use crate::support::{garbage, Backend, Cluster, TestDir, Worker};
use crate::worker::start_workers_with;

/// A job that never fires by schedule and appends its `REDCRON_TRIGGER` to the ledger.
fn job(dir: &TestDir) -> String {
    format!(
        "  - name: adhoc\n    schedule: \"@yearly\"\n    command: 'echo \"$REDCRON_TRIGGER\" >> {}'\n",
        dir.ledger().display()
    )
}

/// The planted entries: (store key or id, stored value), every kind of garbage request for the job, with
/// megabyte-sized ones (etcd takes at most 1.5 MiB).
fn garbage() -> Vec<(String, String)> {
    garbage::trigger_requests("adhoc", 0, Some(1 << 20))
}

/// Writes `entries` as trigger requests straight into the cluster's store, on every node, never to expire.
fn plant(cluster: &Cluster, entries: &[(String, String)]) {
    let failed = garbage::plant_triggers(&garbage::Target::everywhere(cluster), entries, None);
    assert!(failed.is_empty(), "{failed:?}");
}

/// Plants two members that no worker announced, `mallory-1` (not JSON) and `mallory-2` (a megabyte of
/// `host`), as of now and alive for an hour, straight into the cluster's store.
fn plant_members(cluster: &Cluster) {
    let members = garbage::members("mallory", 1 << 20);
    let failed = garbage::plant_members(&garbage::Target::everywhere(cluster), &members);
    assert!(failed.is_empty(), "{failed:?}");
}

/// Writes `entries` as trigger requests straight into the embedded store's file, never to expire.
fn plant_embedded(database: &std::path::Path, entries: &[(String, String)]) {
    let connection = rusqlite::Connection::open(database).expect("open the database");
    connection
        .busy_timeout(Duration::from_secs(10))
        .expect("a busy timeout");
    for (id, value) in entries {
        connection
            .execute(
                "INSERT OR REPLACE INTO triggers (id, job, request, expires_ms) VALUES (?1, 'adhoc', ?2, ?3)",
                rusqlite::params![id, value, i64::MAX],
            )
            .expect("insert a request");
    }
}

/// After the garbage was planted: `worker` warns about each entry (naming it), stays alive with its poller,
/// and a normal trigger runs the job once, with nothing run for the garbage.
fn survives(dir: &TestDir, worker: &mut Worker, config: &std::path::Path) {
    for (id, _) in garbage() {
        let warned = worker.wait_for(Duration::from_secs(20), |event| {
            event["event"] == "store.entry_skipped"
                && event["error"]
                    .as_str()
                    .is_some_and(|error| error.contains(&id))
        });
        assert!(warned.is_some(), "no store.entry_skipped naming {id}");
    }
    // Each bad entry is warned about once, not at every poll.
    std::thread::sleep(Duration::from_secs(3));
    let warnings = worker.events("store.entry_skipped");
    let distinct: std::collections::BTreeSet<String> = warnings
        .iter()
        .map(|event| event["error"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(warnings.len(), distinct.len(), "repeated warnings");
    assert!(
        warnings
            .iter()
            .all(|event| event["error"].as_str().unwrap_or_default().len() < 2_000),
        "a warning quotes a huge entry whole"
    );
    assert!(
        worker.wait_timeout(Duration::ZERO).is_none(),
        "the worker exited"
    );

    let (code, stdout, stderr) = inspect(
        dir,
        config,
        &["trigger", "adhoc", "--wait", "--json", "--timeout", "20s"],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let report = parse(&stdout);
    assert_eq!(report["run"]["outcome"], "success", "{report}");
    let id = report["request"]["id"].as_str().expect("a request id");
    assert_eq!(dir.ledger_lines(), [id], "only the real request ran");
    assert!(!worker.stderr().contains("panicked"), "{}", worker.stderr());
}

/// Garbage trigger requests planted on every node of a shared store: the worker warns about each and
/// keeps polling; a trigger afterwards runs once. On Redis and on etcd.
fn garbage_trigger_requests_are_skipped_and_the_poller_lives(backend: Backend) {
    let cluster = backend.start();
    let dir = TestDir::new();
    let job = job(&dir);
    let mut workers = start_workers_with(&dir, 1, |worker| cluster.config(worker, &job));
    plant(&cluster, &garbage());
    plant_members(&cluster);
    let config = dir.join("w0.yaml");
    survives(&dir, &mut workers[0], &config);
    for id in ["mallory-1", "mallory-2"] {
        let warned = workers[0].wait_for(Duration::from_secs(20), |event| {
            event["event"] == "store.entry_skipped"
                && event["error"]
                    .as_str()
                    .is_some_and(|error| error.contains(id))
        });
        assert!(warned.is_some(), "no store.entry_skipped naming {id}");
    }
    // `status` reads past the garbage too, and says what it skipped.
    let (code, stdout, stderr) = inspect(&dir, &config, &["status", "--json"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let status = parse(&stdout);
    let workers_seen: Vec<&str> = status["workers"]
        .as_array()
        .map(|all| all.iter().filter_map(|w| w["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(workers_seen, ["w0"], "{status}");
    let skipped = status["skipped"].to_string();
    assert!(
        skipped.contains("mallory-2") && skipped.len() < 20_000,
        "{skipped}"
    );
}

crate::on_every_store!(
    async: [],
    sync: [garbage_trigger_requests_are_skipped_and_the_poller_lives],
);

/// The same garbage in the embedded store's file: the worker warns about each and keeps polling; a trigger
/// afterwards runs once.
#[test]
fn garbage_trigger_requests_in_the_embedded_store_are_skipped() {
    let dir = TestDir::new();
    let config = dir.write_config(&crate::embedded::config("w0", &job(&dir)));
    let mut worker = Worker::spawn(&config, &[]);
    worker
        .wait_for_event("worker.started", Duration::from_secs(10))
        .expect("worker started");
    plant_embedded(&dir.join("redcron.db"), &garbage());
    survives(&dir, &mut worker, &config);
}
